"""Mixed steps in the scheduler (a model's ``mixed_shapes``, written by the platform as
``tt._mixed_shapes``): step tables over vLLM's real scheduler. With decodes running, a prompt
is computed beside them, one chunk a step, sized from the captured shapes; decodes never stall;
outputs stay exact. Without shapes, or with more decode rows than any shape holds, steps stay
phase-pure. The runner's phase check accepts a mixed step only when the model runs them, and
only with one prompt chunk."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from vllm_tt_scheduler import (
    MixedStepError,
    Phase,
    SchedulerOptions,
    TTAsyncScheduler,
    TTScheduler,
    step_phase,
)
from vllm_tt_scheduler.mixed import MixedShapes
from vllm_tt_testing.scheduler_sim import (
    Engine,
    SimConfig,
    build_scheduler,
    greedy_tokens,
    make_request,
    step_table,
)

SHAPES = [[4, 16], [4, 32]]


def engine(shapes=SHAPES, scheduler=TTScheduler, async_depth: int = 1, **config: object) -> Engine:
    tt = {"_mixed_shapes": shapes} if shapes else {}
    return Engine(build_scheduler(scheduler, SimConfig(tt=tt, **config)), async_depth=async_depth)  # type: ignore[arg-type]


def decoding(sim: Engine, lengths: dict[str, tuple[int, int]]) -> list:
    for req_id, (prompt, outputs) in lengths.items():
        sim.add(make_request(req_id, prompt, outputs))
    return sim.run(2)


def assert_exact(sim: Engine, lengths: dict[str, tuple[int, int]]) -> None:
    for req_id, (prompt, outputs) in lengths.items():
        assert sim.logs[req_id].tokens == greedy_tokens(req_id, prompt, outputs), req_id
        assert sim.logs[req_id].finishes == 1


def test_a_prompt_arriving_during_decode_is_computed_beside_the_decodes_in_captured_chunks() -> None:
    sim = engine()
    running = {"a": (8, 6), "b": (8, 6)}
    records = decoding(sim, running)
    sim.add(make_request("c", 40, 3))
    records += sim.run(50)
    assert step_table(records) == [
        (1, "P", 0, 2, {"a": 8, "b": 8}, (), ()),
        (1, "D", 0, 2, {"a": 1, "b": 1}, (), ()),
        # 40 tokens to go: the largest chunk (32), then the smallest that holds the rest (16 for 8).
        (1, "M", 0, 3, {"a": 1, "b": 1, "c": 32}, (), ()),
        (1, "M", 0, 3, {"a": 1, "b": 1, "c": 8}, (), ()),
        (1, "D", 0, 3, {"a": 1, "b": 1, "c": 1}, (), ()),
        (1, "D", 0, 3, {"a": 1, "b": 1, "c": 1}, ("a", "b", "c"), ()),
        (1, "E", 0, 0, {}, (), ()),
    ]
    assert_exact(sim, {**running, "c": (40, 3)})


def test_one_prompt_chunk_per_step_and_no_decode_ever_stalls() -> None:
    sim = engine()
    running = {"a": (8, 12)}
    records = decoding(sim, running)
    for req_id in "xyz":
        sim.add(make_request(req_id, 20, 2))
    records += sim.run(60)
    rows = step_table(records)
    mixed = [row for row in rows if row[1] == "M"]
    assert mixed and all(sum(1 for r in row[4] if r != "a" and row[4][r] > 1) == 1 for row in mixed)
    # Once "a" decodes, every step gives it a token until it ends: no prefill-only step.
    first_decode = next(i for i, row in enumerate(rows) if row[1] == "D")
    a_ends = next(i for i, row in enumerate(rows) if "a" in row[5])
    assert all("a" in row[4] for row in rows[first_decode : a_ends + 1]), rows
    assert_exact(sim, {**running, "x": (20, 2), "y": (20, 2), "z": (20, 2)})


def test_async_scheduling_mixes_too_and_stays_exact() -> None:
    sim = engine(scheduler=TTAsyncScheduler, async_depth=2, async_scheduling=True)
    running = {"a": (8, 8), "b": (8, 8)}
    records = decoding(sim, running)
    sim.add(make_request("c", 40, 3))
    records += sim.run(50)
    assert any(row[1] == "M" for row in step_table(records))
    assert_exact(sim, {**running, "c": (40, 3)})


def test_without_shapes_or_beyond_the_largest_decode_rows_steps_stay_phase_pure() -> None:
    for shapes, decodes in ((None, 2), ([[1, 32]], 2)):
        sim = engine(shapes)
        running = {f"r{i}": (8, 6) for i in range(decodes)}
        records = decoding(sim, running)
        sim.add(make_request("c", 40, 3))
        records += sim.run(50)
        assert {row[1] for row in step_table(records)} <= {"P", "D", "E"}, shapes
        assert_exact(sim, {**running, "c": (40, 3)})


def test_chunk_sizes_come_from_the_captured_shapes() -> None:
    shapes = MixedShapes(((2, 64), (4, 16), (4, 32), (8, 8)))
    assert shapes.chunk_for(3, 40) == 32  # the smallest D holding 3 rows is 4: its largest chunk
    assert shapes.chunk_for(3, 10) == 16  # ... or its smallest chunk that holds the need
    assert shapes.chunk_for(1, 50) == 64
    assert shapes.chunk_for(5, None) == 8
    assert shapes.chunk_for(9, 1) is None  # no shape holds 9 decode rows


def test_an_itl_target_keeps_only_the_chunks_whose_step_fits_it() -> None:
    shapes = MixedShapes(((4, 16), (4, 32), (4, 64)))
    within = lambda chunk: chunk <= 32  # noqa: E731
    assert shapes.chunk_for(3, 50, within) == 32  # 64 would cover it but its step is too long
    assert shapes.chunk_for(3, 10, within) == 16  # the smallest that covers the need, as without a target
    assert shapes.chunk_for(3, 50, lambda chunk: False) == 16  # none fits: the smallest, so the prompt progresses


# A roofline where a decode step takes 10 ms and each prompt token 1 ms: a mixed step beside
# the decodes is max(10 ms, (rows + chunk) ms).
MS_ROOFLINE = {"program_s": 0.0, "weights_s": 0.01, "kv_s_per_token": 0.0, "prefill_s_per_token": 0.001,
               "attention_s_per_token_pair": 0.0, "description": "1 ms per token"}


@pytest.mark.parametrize(("itl_slo_ms", "chunks"), [(0, [32, 8]), (40, [32, 8]), (30, [16, 16, 8]), (5, [16, 16, 8])])
def test_the_slo_aware_policy_sizes_chunks_by_the_step_cost_models_time(itl_slo_ms: float, chunks: list[int]) -> None:
    tt = {"_mixed_shapes": SHAPES, "_step_cost": MS_ROOFLINE, "itl_slo_ms": itl_slo_ms}
    sim = Engine(build_scheduler(TTScheduler, SimConfig(tt=tt)))
    running = {"a": (8, 8), "b": (8, 8)}
    records = decoding(sim, running)
    sim.add(make_request("c", 40, 3))
    records += sim.run(50)
    # 2 decode rows + 32 tokens = 34 ms: within 40 ms, not 30 ms, where the 16 chunk (18 ms) fits;
    # at 5 ms none fits, so the smallest; the last 8 tokens in a 16 program either way.
    # (step_table folds repeated rows: its first column counts them.)
    c_chunks = [row[4]["c"] for row in step_table(records) if row[4].get("c", 0) > 1 for _ in range(row[0])]
    assert c_chunks == chunks
    assert_exact(sim, {**running, "c": (40, 3)})
    summary = sim.scheduler.policy_summary()
    assert ("chunks sized to the ITL target" in summary) == bool(itl_slo_ms), summary


def test_the_phase_check_accepts_a_mixed_step_only_for_a_mixed_model_and_one_chunk() -> None:
    def output(new: list[str], cached: list[str]) -> SimpleNamespace:
        return SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in new],
            scheduled_cached_reqs=SimpleNamespace(req_ids=cached, resumed_req_ids=set()),
            total_num_scheduled_tokens=len(new) + len(cached))

    one_chunk = output(["c"], ["a", "b"])
    assert step_phase(one_chunk, set(), mixed=True) is Phase.MIXED
    with pytest.raises(MixedStepError, match="mixed steps are off"):
        step_phase(one_chunk, set())
    with pytest.raises(MixedStepError, match="a mixed step holds one prompt chunk"):
        step_phase(output(["c", "d"], ["a"]), set(), mixed=True)
    assert step_phase(output([], ["a", "b"]), {"b"}, mixed=True) is Phase.MIXED  # b: a partial prefill


def test_the_trace_marks_mixed_steps_and_the_startup_summary_lists_the_shapes(tmp_path, monkeypatch) -> None:
    trace = tmp_path / "steps.jsonl"
    monkeypatch.setenv("TT_STEP_TRACE", str(trace))
    sim = engine()
    assert sim.scheduler.policy_summary().endswith("mixed steps: 4 decode rows + 16 tokens, 4 decode rows + 32 tokens")
    decoding(sim, {"a": (8, 6)})
    sim.add(make_request("c", 20, 2))
    sim.run(30)
    sim.scheduler.shutdown()
    phases = [json.loads(line)["phase"] for line in trace.read_text().splitlines()]
    assert "mixed" in phases
    assert engine(None).scheduler.policy_summary().endswith("mixed steps off")


def test_mixed_shapes_key_is_checked() -> None:
    assert SchedulerOptions.from_additional_config({"tt": {"_mixed_shapes": [[8, 64], [4, 32]]}}).mixed_shapes == (
        (4, 32), (8, 64))
    with pytest.raises(ValueError, match=r"tt._mixed_shapes=\[\[4, 0\]\] must be a list of \[decode_rows, chunk_tokens\]"):
        SchedulerOptions.from_additional_config({"tt": {"_mixed_shapes": [[4, 0]]}})
