"""``TT_STEP_TRACE``: one JSON line per engine step; nothing at all when unset."""

from __future__ import annotations

import json

from vllm_tt_scheduler import TTScheduler
from vllm_tt_scheduler.trace import NullStepTrace
from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler, make_request


def run(num_blocks: int | None = None) -> Engine:
    sim = Engine(build_scheduler(TTScheduler, SimConfig(max_model_len=64, num_blocks=num_blocks)))
    sim.add(make_request("a", 16, 24))
    sim.add(make_request("b", 16, 24))
    sim.run(200)
    sim.scheduler.shutdown()
    return sim


def test_trace_has_one_line_per_step(tmp_path, monkeypatch) -> None:
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TT_STEP_TRACE", str(path))
    sim = run(num_blocks=6)  # forces a preemption
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == sim.step_index
    assert [line["step"] for line in lines] == list(range(len(lines)))
    assert lines[0] == {
        "step": 0,
        "phase": "prefill",
        "scheduled": {"a": 16, "b": 16},
        "num_waiting": 0,
        "num_running": 2,
        "preempted": [],
        "finished": [],
        "kv_blocks_used": 2,
        "kv_blocks_total": 5,
        "retried": False,
    }
    preempted = [line for line in lines if line["preempted"]]
    assert [line["preempted"] for line in preempted] == [["b"]]
    assert preempted[0]["num_waiting"] == 1
    assert {line["phase"] for line in lines} == {"prefill", "decode", "empty"}
    assert all(line["kv_blocks_used"] <= line["kv_blocks_total"] for line in lines)
    assert lines[-1]["finished"] == ["b"]


def test_trace_off_is_the_null_object(monkeypatch) -> None:
    monkeypatch.delenv("TT_STEP_TRACE", raising=False)
    sim = run()
    assert isinstance(sim.scheduler._trace, NullStepTrace)


def test_empty_trace_variable_means_off(monkeypatch) -> None:
    monkeypatch.setenv("TT_STEP_TRACE", "")
    sim = Engine(build_scheduler(TTScheduler, SimConfig()))
    assert isinstance(sim.scheduler._trace, NullStepTrace)
