"""The lane coordinator as vLLM's engine core sees it: every SchedulerInterface method it calls,
the lane shape it is configured with, and its step trace."""

from __future__ import annotations

import functools
import json
from concurrent.futures import Future

import numpy as np
import pytest
from vllm.config import KVEventsConfig
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.request import Request, RequestStatus
from vllm_tt_scheduler import TTLaneCoordinator
from vllm_tt_scheduler.lanes.shape import LaneShape
from vllm_tt_scheduler.lanes.trace import NullLaneTrace
from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler, build_vllm_config, make_request


def config(lanes: int = 2, rows: int = 2, **fields: object) -> SimConfig:
    tt = {"_lanes": lanes, "_rows_per_lane": rows, **fields.pop("tt", {})}  # type: ignore[dict-item]
    return SimConfig(max_num_seqs=lanes * rows, tt=tt, **fields)  # type: ignore[arg-type]


def coordinator(lanes: int = 2, rows: int = 2, log_stats: bool = False, **fields: object) -> TTLaneCoordinator:
    cls = functools.partial(TTLaneCoordinator, log_stats=log_stats)
    return build_scheduler(cls, config(lanes, rows, **fields))


def test_no_interface_method_is_left_abstract() -> None:
    assert not TTLaneCoordinator.__abstractmethods__


def test_request_queries_span_all_lanes() -> None:
    sim = Engine(coordinator())
    for req_id in "abc":
        sim.add(make_request(req_id, 8, 4))
    sched = sim.scheduler
    assert [sched.lane_of(r) for r in "abc"] == [0, 1, 0]
    assert all(sched.has_request(r) for r in "abc") and not sched.has_request("zzz")
    assert sched.get_request_counts() == (0, 3)
    assert sched.get_num_unfinished_requests() == 3 and sched.has_unfinished_requests()
    assert sched.has_requests() and not sched.has_finished_requests()
    sim.step()
    assert sched.get_request_counts() == (3, 0)
    assert set(sched.requests) == {"a", "b", "c"}
    assert sorted(r.request_id for r in sched.running) == ["a", "b", "c"] and not sched.waiting


def test_finish_requests_reaches_every_lane_and_hands_ids_to_the_runner() -> None:
    sim = Engine(coordinator(lanes=3, rows=2))
    for req_id in "abcdef":
        sim.add(make_request(req_id, 8, 10))
    sim.step()
    sched = sim.scheduler
    aborted = sched.finish_requests(iter(["a", "e", "unknown"]), RequestStatus.FINISHED_ABORTED)
    assert sorted(r.request_id for r in aborted) == ["a", "e"]
    assert [r.request_id for r in sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)] == ["b"]
    assert sched.has_finished_requests()
    record = sim.step()
    assert record.sent_finished == ("a", "b", "e")
    rest = sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
    assert sorted(r.request_id for r in rest) == ["c", "d", "f"]
    assert sched.get_num_unfinished_requests() == 0


def test_next_input_of_a_streaming_session_goes_to_its_lane() -> None:
    sched = coordinator()
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    sched.add_request(make_request("a", 8, 4))
    sched.add_request(make_request("b", 8, 4))
    sched.add_request(Request("s", [5, 6, 7], params, None, resumable=True))  # lanes tie: lane 0
    assert sched.lane_of("s") == 0
    sched.add_request(Request("s", [8], params, None, resumable=True))  # lane 1 is lighter now
    assert sched.lane_of("s") == 0 and not sched.lanes[1].has_request("s")
    assert len(sched.lanes[0].requests["s"].streaming_queue) == 1


def test_pause_state_is_every_lane_s() -> None:
    sched = coordinator()
    sched.add_request(make_request("a", 8, 4))
    sched.add_request(make_request("b", 8, 4))
    sched.set_pause_state(PauseState.PAUSED_ALL)
    assert sched.pause_state is PauseState.PAUSED_ALL
    assert [lane.pause_state for lane in sched.lanes] == [PauseState.PAUSED_ALL] * 2
    assert sched.get_num_unfinished_requests() == 0
    sched.set_pause_state(PauseState.UNPAUSED)
    assert sched.get_num_unfinished_requests() == 2


def test_reset_prefix_cache_needs_every_lane() -> None:
    sim = Engine(coordinator(enable_prefix_caching=True))
    sim.add(make_request("a", 20, 10))
    sim.step()  # a holds blocks in lane 0; lane 1 is empty
    sched = sim.scheduler
    assert sched.reset_prefix_cache() is False
    assert sched.reset_prefix_cache(reset_running_requests=True) is True
    assert sched.get_request_counts() == (0, 1)  # a was preempted back to waiting
    sim.run(50)
    assert sim.logs["a"].finishes == 1
    assert sched.reset_prefix_cache() is True


def test_encoder_cache_reset_and_shutdown_reach_every_lane(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("TT_STEP_TRACE", str(tmp_path / "t.jsonl"))
    sched = coordinator()
    calls: list[str] = []
    for index, lane in enumerate(sched.lanes):
        monkeypatch.setattr(lane.encoder_cache_manager, "reset", lambda i=index: calls.append(f"reset{i}"))
        monkeypatch.setattr(lane, "shutdown", lambda i=index: calls.append(f"shutdown{i}"))
    sched.reset_encoder_cache()
    sched.shutdown()
    assert calls == ["reset0", "reset1", "shutdown0", "shutdown1"]
    assert sched._trace._file is None  # closed


def test_no_connectors_and_no_kv_events() -> None:
    sched = coordinator()
    assert sched.connector is None and sched.ec_connector is None
    assert sched.get_kv_connector() is None and sched.get_ec_connector() is None
    assert sched.get_kv_event_publisher_config() is None


def test_stats_cover_every_lane_once_per_step() -> None:
    sim = Engine(coordinator(lanes=2, rows=2, log_stats=True))
    for req_id in "abc":
        sim.add(make_request(req_id, 8, 5))
    sched = sim.scheduler
    out = sched.schedule()
    runner_out, _ = sim.runner.execute(out)
    results = sched.update_from_output(out, runner_out)
    records = [eco.scheduler_stats for eco in results.values() if eco.scheduler_stats is not None]
    assert len(records) == 1
    assert (records[0].num_running_reqs, records[0].num_waiting_reqs) == (3, 0)
    usage = [lane.get_kv_cache_usage() for lane in sched.lanes]
    assert records[0].kv_cache_usage == pytest.approx(sum(usage) / 2) == sched.get_kv_cache_usage()
    assert usage[0] > usage[1] > 0
    assert sched.make_stats().num_running_reqs == 3
    assert coordinator().make_stats() is None


def test_draft_tokens_reach_the_lane_holding_each_request() -> None:
    sim = Engine(coordinator())
    for req_id in "ab":
        sim.add(make_request(req_id, 8, 5))
    sim.step()
    sched = sim.scheduler
    sched.update_draft_token_ids(DraftTokenIds(req_ids=["a", "b", "gone"], draft_token_ids=[[1], [2], [3]]))
    assert sched.lanes[0].requests["a"].spec_token_ids == [1]
    assert sched.lanes[1].requests["b"].spec_token_ids == [2]
    out = sched.schedule()
    sched.update_draft_token_ids_in_output(DraftTokenIds(["a"], [[1]]), out)
    assert out.num_invalid_spec_tokens == {}


class _Grammar:
    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False


def test_grammar_bitmask_has_each_lane_s_rows(monkeypatch) -> None:
    sim = Engine(coordinator())
    params = SamplingParams(max_tokens=4, ignore_eos=True, structured_outputs=StructuredOutputsParams(json={}))
    for req_id in "ab":
        request = make_request(req_id, 8, 4, params)
        ready: Future = Future()
        ready.set_result(_Grammar())
        request.structured_output_request.grammar = ready
        sim.add(request)
    sim.step()
    sched = sim.scheduler
    # vLLM fills one shared buffer and returns a view of it: the second lane's call overwrites.
    shared = np.zeros((4, 2), dtype=np.int32)

    def grammar_bitmask(requests, req_ids, spec_tokens):  # type: ignore[no-untyped-def]
        for row, req_id in enumerate(req_ids):
            shared[row] = ord(req_id)
        return shared[: len(req_ids)]

    monkeypatch.setattr(sched.lanes[0].structured_output_manager, "grammar_bitmask", grammar_bitmask)
    out = sched.schedule()
    assert out.has_structured_output_requests
    mask = sched.get_grammar_bitmask(out)
    assert mask.structured_output_request_ids == ["a", "b"]
    assert mask.grammar_bitmask.tolist() == [[ord("a")] * 2, [ord("b")] * 2]
    empty = sched.schedule()
    empty.has_structured_output_requests = False
    assert sched.get_grammar_bitmask(empty) is None


def test_an_unknown_output_is_refused() -> None:
    sched = coordinator()
    sched.add_request(make_request("a", 8, 4))
    other = coordinator()
    other.add_request(make_request("a", 8, 4))
    foreign = other.schedule()
    with pytest.raises(RuntimeError, match="did not schedule"):
        sched.update_from_output(foreign, None)  # type: ignore[arg-type]


# -- configuration ----------------------------------------------------------------------------
def test_each_lane_admits_its_rows_and_shares_the_rest() -> None:
    sched = coordinator(lanes=4, rows=3)
    engine_config = sched.vllm_config
    assert engine_config.scheduler_config.max_num_seqs == 12
    for lane in sched.lanes:
        assert lane.max_num_running_reqs == 3
        assert lane.vllm_config.scheduler_config.max_num_seqs == 3
        assert lane.vllm_config.additional_config is engine_config.additional_config
        assert lane.vllm_config.model_config is engine_config.model_config
    assert len({id(lane.kv_cache_manager) for lane in sched.lanes}) == 4
    assert sched.numbering.blocks_per_lane == config(4, 3).pool_blocks


@pytest.mark.parametrize(
    ("tt", "max_num_seqs", "message"),
    [
        ({}, 4, "tt._lanes=None"),
        ({"_lanes": True, "_rows_per_lane": 2}, 4, "tt._lanes=True"),
        ({"_lanes": 2, "_rows_per_lane": 0}, 4, "tt._rows_per_lane=0"),
        ({"_lanes": 2, "_rows_per_lane": 2}, 6, r"max_num_seqs=6 must equal lanes x rows per lane \(2 x 2 = 4\)"),
    ],
)
def test_lane_shape_errors_name_the_setting(tt: dict, max_num_seqs: int, message: str) -> None:
    vllm_config = build_vllm_config(SimConfig(max_num_seqs=max_num_seqs, tt=tt))
    with pytest.raises(ValueError, match=message):
        LaneShape.from_vllm_config(vllm_config)


def test_lanes_refuse_an_active_seqs_cap_and_kv_events() -> None:
    vllm_config = build_vllm_config(config())
    vllm_config.scheduler_config.max_num_active_seqs = 2
    with pytest.raises(ValueError, match="max_num_active_seqs=2 is not supported with lanes"):
        LaneShape.from_vllm_config(vllm_config)
    vllm_config = build_vllm_config(config())
    vllm_config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True)
    with pytest.raises(ValueError, match="enable_kv_cache_events=True is not supported with lanes"):
        LaneShape.from_vllm_config(vllm_config)
    assert LaneShape.from_vllm_config(build_vllm_config(config(3, 5))) == LaneShape(3, 5)


# -- step trace -------------------------------------------------------------------------------
def test_trace_lines_break_each_step_down_by_lane(tmp_path, monkeypatch) -> None:
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TT_STEP_TRACE", str(path))
    sim = Engine(coordinator(lanes=2, rows=2))
    sim.add(make_request("a", 16, 2))
    sim.add(make_request("b", 8, 3))
    sim.run(20)
    sim.scheduler.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == sim.step_index  # one line per step: the lanes write none of their own
    assert lines[0] == {
        "step": 0, "phase": "prefill", "scheduled": {"a": 16, "b": 8}, "num_waiting": 0, "num_running": 2,
        "preempted": [], "finished": [], "kv_blocks_used": 2, "kv_blocks_total": 2 * 64, "retried": False,
        "lanes": [
            {"scheduled": {"a": 16}, "num_waiting": 0, "num_running": 1, "preempted": [], "finished": [],
             "kv_blocks_used": 1, "kv_blocks_total": 64},
            {"scheduled": {"b": 8}, "num_waiting": 0, "num_running": 1, "preempted": [], "finished": [],
             "kv_blocks_used": 1, "kv_blocks_total": 64},
        ],
    }
    assert [line["lanes"][0]["finished"] for line in lines] == [[], [], ["a"], []]
    assert [line["finished"] for line in lines][-2:] == [["a"], ["b"]]


def test_trace_off_is_the_null_object(monkeypatch) -> None:
    monkeypatch.delenv("TT_STEP_TRACE", raising=False)
    assert isinstance(coordinator()._trace, NullLaneTrace)


def test_startup_line_and_step_trace_once_for_all_lanes(monkeypatch, tmp_path) -> None:
    """Lanes share one policy and one trace file: the coordinator logs the policy once (naming
    lanes x rows) and is the only writer of ``TT_STEP_TRACE``; no lane opens the file."""
    import logging

    import vllm_tt_scheduler.scheduler as phase_scheduler

    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TT_STEP_TRACE", str(path))
    opened: list[str | None] = []
    real_open = phase_scheduler.open_step_trace
    monkeypatch.setattr(phase_scheduler, "open_step_trace", lambda p: opened.append(p) or real_open(p))
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    vllm_logger = logging.getLogger("vllm")
    level = vllm_logger.level
    vllm_logger.addHandler(handler)
    vllm_logger.setLevel(logging.INFO)
    try:
        sim = Engine(coordinator(lanes=4, rows=2))
    finally:
        vllm_logger.removeHandler(handler)
        vllm_logger.setLevel(level)
    messages = [r.getMessage() for r in records if r.getMessage().startswith("TT ")]
    assert len(messages) == 1 and messages[0].startswith("TT lane coordinator: 4 lanes x 2 rows")
    assert "prefill_burst=" in messages[0] and f"step trace={path}" in messages[0]
    assert opened == []
    for req_id in "abcde":
        sim.add(make_request(req_id, 8, 3))
    assert sim.run(40)
    sim.scheduler.shutdown()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(len(lines))) and len(lines) > 3
    assert all(len(line["lanes"]) == 4 for line in lines)


def test_idle_lanes_run_no_pass_until_they_have_work_or_ids_to_hand_over(monkeypatch) -> None:
    """A lane with nothing in the step's phase and nothing to hand over (finished or preempted
    ids) is skipped: no vLLM pass and no update (their fixed cost is most of a lane's host
    cost). It runs again once it has work, and once more to hand its finish to the runner."""
    sim = Engine(coordinator(lanes=2, rows=2, log_stats=True))
    sched = sim.scheduler
    passes: list[list[tuple[int, set[str]]]] = []
    for index, lane in enumerate(sched.lanes):
        real = lane.run_pass

        def counted(*args, index=index, real=real, **kwargs):  # type: ignore[no-untyped-def]
            out = real(*args, **kwargs)
            passes[-1].append((index, set(out.finished_req_ids)))
            return out

        monkeypatch.setattr(lane, "run_pass", counted)

    def step() -> list[int]:
        passes.append([])
        sim.step()
        return [index for index, _ in passes[-1]]

    sim.add(make_request("a", 8, 30))
    assert [step() for _ in range(3)] == [[0]] * 3  # lane 1 holds nothing
    sim.add(make_request("x", 8, 2))
    assert sched.lane_of("x") == 1
    assert step() == [1]  # x's prefill: lane 0's decode stalls, and its pass is skipped
    assert step() == [0, 1]  # x's last decode
    assert sim.logs["x"].finishes == 1
    assert step() == [0, 1] and passes[-1][1] == (1, {"x"})  # lane 1 hands the finish over
    assert [step() for _ in range(2)] == [[0]] * 2
    stats = sched.make_stats()
    assert stats is not None and stats.num_running_reqs == 1  # stats still cover every lane
