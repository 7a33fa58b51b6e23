"""Step tables of the lane coordinator: vLLM's real scheduler in every lane, one row per step.

Row: (repeat, phase, lanes, finished, preempted), where ``lanes`` holds each lane's
(waiting, running, scheduled tokens) right after ``schedule()``, ``finished`` are the requests
whose finish the step's update reported, and identical consecutive rows are collapsed. The fake
runner (``vllm_tt_testing.scheduler_sim``) raises on a mixed step or on rows inconsistent with what it
ran before; every request's tokens are checked against its never-preempted greedy output.
"""

from __future__ import annotations

import json

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import ModelRunnerOutput
from vllm_tt_scheduler import Phase, TTLaneCoordinator
from vllm_tt_scheduler.lanes.member import TTAsyncLaneScheduler, TTLaneScheduler
from vllm_tt_testing.scheduler_sim import (
    Engine,
    FakeRunner,
    SimConfig,
    StepRecord,
    build_scheduler,
    collapse,
    greedy_tokens,
    make_request,
)

Slice = tuple[int, int, dict[str, int]]


class Recording(TTLaneCoordinator):
    """Keeps every merged step and each lane's (waiting, running, scheduled) right after it."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.slices: list[tuple[Slice, ...]] = []
        self.outputs: list[SchedulerOutput] = []

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        out = super().schedule(throttle_prefills)
        lanes = []
        for lane in self.lanes:
            running, waiting = lane.get_request_counts()
            scheduled = {req_id: n for req_id, n in out.num_scheduled_tokens.items() if lane.has_request(req_id)}
            lanes.append((waiting, running, scheduled))
        self.slices.append(tuple(lanes))
        self.outputs.append(out)
        return out


def engine(lanes: int, rows: int, *, runner: FakeRunner | None = None, async_scheduling: bool = False,
           **config: object) -> Engine:
    tt = {"_lanes": lanes, "_rows_per_lane": rows, **config.pop("tt", {})}  # type: ignore[dict-item]
    sim_config = SimConfig(max_num_seqs=lanes * rows, tt=tt, async_scheduling=async_scheduling, **config)  # type: ignore[arg-type]
    sim = Engine(build_scheduler(Recording, sim_config), async_depth=2 if async_scheduling else 1)
    if runner is not None:
        sim.runner = runner
    return sim


def lane_table(sim: Engine, records: list[StepRecord]) -> list[tuple[object, ...]]:
    """Rows ``(repeat, phase, lanes, finished, preempted)``, identical rows collapsed."""
    slices = sim.scheduler.slices
    return collapse((record.phase_code, slices[record.index], record.finished, record.preempted) for record in records)


def add_all(sim: Engine, lengths: dict[str, tuple[int, int]]) -> None:
    for req_id, (prompt, out) in lengths.items():
        sim.add(make_request(req_id, prompt, out))


def assert_greedy_and_clean(sim: Engine, lengths: dict[str, tuple[int, int]]) -> None:
    for req_id, (prompt, out) in lengths.items():
        assert sim.logs[req_id].tokens == greedy_tokens(req_id, prompt, out), req_id
    assert all(log.finishes == 1 for log in sim.logs.values())
    assert not sim.unsent_finished
    assert not sim.runner.rows
    assert not sim.scheduler.has_requests()


def test_all_lanes_run_the_same_phase() -> None:
    # a and b decode in lanes 0 and 1; c arrives (lane 0: ties go to the lowest lane) and is
    # prefilled in a step where lane 1 contributes nothing: b's decode waits one step.
    sim = engine(2, 2, tt={"prefill_hold": 0})
    lengths = {"a": (8, 5), "b": (8, 5)}
    add_all(sim, lengths)
    records = sim.run(2)
    lengths["c"] = (8, 2)
    sim.add(make_request("c", 8, 2))
    records += sim.run(50)
    assert lane_table(sim, records) == [
        (1, "P", ((0, 1, {"a": 8}), (0, 1, {"b": 8})), (), ()),
        (1, "D", ((0, 1, {"a": 1}), (0, 1, {"b": 1})), (), ()),
        (1, "P", ((0, 2, {"c": 8}), (0, 1, {})), (), ()),
        (1, "D", ((0, 2, {"a": 1, "c": 1}), (0, 1, {"b": 1})), ("c",), ()),
        (1, "D", ((0, 1, {"a": 1}), (0, 1, {"b": 1})), (), ()),
        (1, "D", ((0, 1, {"a": 1}), (0, 1, {"b": 1})), ("a", "b"), ()),
        (1, "E", ((0, 0, {}), (0, 0, {})), (), ()),
    ]
    assert_greedy_and_clean(sim, lengths)


MIXED = {"_mixed_shapes": [[4, 16], [4, 32]], "prefill_hold": 0}


def test_a_mixed_model_computes_one_lanes_prompt_beside_every_lanes_decodes() -> None:
    # The shapes' decode rows count the whole batch (2 lanes x 2 rows). c (lane 0: ties go to
    # the lowest) is computed beside a's and b's decodes, 32 tokens then the 8 left; d (lane 1)
    # waits for c's last chunk (one prompt per step, partial prefills first), then is computed
    # in lane 1 beside every decode. No step stalls the decodes.
    sim = engine(2, 2, runner=FakeRunner(mixed=True), tt=MIXED)
    lengths = {"a": (8, 12), "b": (8, 12)}
    add_all(sim, lengths)
    records = sim.run(2)
    lengths |= {"c": (40, 2), "d": (20, 2)}
    add_all(sim, {"c": lengths["c"]})
    records += sim.run(1)
    add_all(sim, {"d": lengths["d"]})
    records += sim.run(50)
    assert lane_table(sim, records) == [
        (1, "P", ((0, 1, {"a": 8}), (0, 1, {"b": 8})), (), ()),
        (1, "D", ((0, 1, {"a": 1}), (0, 1, {"b": 1})), (), ()),
        (1, "M", ((0, 2, {"a": 1, "c": 32}), (0, 1, {"b": 1})), (), ()),
        (1, "M", ((0, 2, {"a": 1, "c": 8}), (1, 1, {"b": 1})), (), ()),
        (1, "M", ((0, 2, {"a": 1, "c": 1}), (0, 2, {"b": 1, "d": 20})), ("c",), ()),
        (1, "D", ((0, 1, {"a": 1}), (0, 2, {"b": 1, "d": 1})), ("d",), ()),
        (5, "D", ((0, 1, {"a": 1}), (0, 1, {"b": 1})), (), ()),
        (1, "D", ((0, 1, {"a": 1}), (0, 1, {"b": 1})), ("a", "b"), ()),
        (1, "E", ((0, 0, {}), (0, 0, {})), (), ()),
    ]
    assert_greedy_and_clean(sim, lengths)


def test_without_mixed_shapes_lanes_stay_phase_pure() -> None:
    sim = engine(2, 2, tt={"prefill_hold": 0})
    lengths = {"a": (8, 6), "b": (8, 6), "c": (40, 2)}
    add_all(sim, {k: lengths[k] for k in "ab"})
    records = sim.run(2)
    add_all(sim, {"c": lengths["c"]})
    records += sim.run(50)
    assert {row[1] for row in lane_table(sim, records)} == {"P", "D", "E"}
    assert_greedy_and_clean(sim, lengths)


def test_new_requests_go_to_the_least_loaded_lane_and_stay() -> None:
    sim = engine(3, 2)
    coordinator = sim.scheduler
    lengths = {"a": (8, 2), "b": (8, 9), "c": (8, 9), "d": (8, 9), "e": (8, 9)}
    add_all(sim, lengths)
    assert [coordinator.lane_of(r) for r in "abcde"] == [0, 1, 2, 0, 1]
    sim.run(4)  # a finished: lane 0 holds d only, lanes 1 and 2 hold two and one
    assert sim.logs["a"].finishes == 1
    lengths["f"] = (8, 3)
    sim.add(make_request("f", 8, 3))
    assert coordinator.lane_of("f") == 0  # ties (0 and 2 hold one each) go to the lowest lane
    homes = {r: coordinator.lane_of(r) for r in "bcdef"}
    while sim.has_work():
        sim.step()
        for req_id, lane in homes.items():
            assert coordinator.lane_of(req_id) in (lane, None)
    assert_greedy_and_clean(sim, lengths)


def test_idle_lanes_contribute_empty_slices() -> None:
    sim = engine(4, 2)
    lengths = {"a": (8, 3)}
    add_all(sim, lengths)
    idle = ((0, 0, {}),) * 3
    assert lane_table(sim, sim.run(50)) == [
        (1, "P", ((0, 1, {"a": 8}), *idle), (), ()),
        (1, "D", ((0, 1, {"a": 1}), *idle), (), ()),
        (1, "D", ((0, 1, {"a": 1}), *idle), ("a",), ()),
        (1, "E", ((0, 0, {}), *idle), (), ()),  # hands a's finished id to the runner
    ]
    assert sim.scheduler.outputs[-1].finished_req_ids == {"a"}
    assert_greedy_and_clean(sim, lengths)


def test_preemption_stays_inside_its_lane() -> None:
    # 5 usable KV blocks of 16 tokens per lane. a and c share lane 0 and each grow to 40 tokens
    # (3 blocks): c is preempted there and resumes there, replaying prompt + generated tokens
    # (16 + 17) as a prefill. b, alone in lane 1, never notices but for the resume step.
    sim = engine(2, 2, max_model_len=64, num_blocks=6)
    lengths = {"a": (16, 24), "b": (16, 24), "c": (16, 24)}
    add_all(sim, lengths)
    assert [sim.scheduler.lane_of(r) for r in "abc"] == [0, 1, 0]
    assert lane_table(sim, sim.run(200)) == [
        (1, "P", ((0, 2, {"a": 16, "c": 16}), (0, 1, {"b": 16})), (), ()),
        (16, "D", ((0, 2, {"a": 1, "c": 1}), (0, 1, {"b": 1})), (), ()),
        (1, "D", ((1, 1, {"a": 1}), (0, 1, {"b": 1})), (), ("c",)),
        (5, "D", ((1, 1, {"a": 1}), (0, 1, {"b": 1})), (), ()),
        (1, "D", ((1, 1, {"a": 1}), (0, 1, {"b": 1})), ("a", "b"), ()),
        (1, "P", ((0, 1, {"c": 33}), (0, 0, {})), (), ()),
        (5, "D", ((0, 1, {"c": 1}), (0, 0, {})), (), ()),
        (1, "D", ((0, 1, {"c": 1}), (0, 0, {})), ("c",), ()),
        (1, "E", ((0, 0, {}), (0, 0, {})), (), ()),
    ]
    resumed = next(out for out in sim.scheduler.outputs if "c" in out.scheduled_cached_reqs.resumed_req_ids)
    blocks = resumed.scheduled_cached_reqs.new_block_ids[0]
    assert blocks and all(block < 6 for group in blocks for block in group)  # lane 0's numbering
    assert_greedy_and_clean(sim, lengths)


def test_zero_token_prefill_is_redone_as_decode_in_every_lane(tmp_path, monkeypatch) -> None:
    # With prefix caching the KV need of d cannot be predicted, so its prefill pass (lane 0) is
    # tried and admits nothing; lane 1 has no prefill work: the step is redone as decode in
    # both lanes. a finished in the previous step and that pass drained its id: the decode step
    # still hands it to the runner. e finishes in the retried step itself.
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TT_STEP_TRACE", str(trace))
    sim = engine(2, 2, max_model_len=64, num_blocks=7, enable_prefix_caching=True, tt={"prefill_hold": 0})
    lengths = {"a": (16, 3), "b": (16, 30), "c": (32, 30), "e": (16, 4)}
    add_all(sim, lengths)
    records = sim.run(3)
    lengths["d"] = (60, 2)
    sim.add(make_request("d", 60, 2))
    assert sim.scheduler.lane_of("d") == 0
    records += sim.run(100)
    assert lane_table(sim, records)[:5] == [
        (1, "P", ((0, 2, {"a": 16, "c": 32}), (0, 2, {"b": 16, "e": 16})), (), ()),
        (1, "D", ((0, 2, {"a": 1, "c": 1}), (0, 2, {"b": 1, "e": 1})), (), ()),
        (1, "D", ((0, 2, {"a": 1, "c": 1}), (0, 2, {"b": 1, "e": 1})), ("a",), ()),
        (1, "D", ((1, 1, {"c": 1}), (0, 2, {"b": 1, "e": 1})), ("e",), ()),  # the retried step
        (25, "D", ((1, 1, {"c": 1}), (0, 1, {"b": 1})), (), ()),
    ]
    retried = records[3]
    assert retried.phase is Phase.DECODE and retried.sent_finished == ("a",)
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    assert lines[3]["retried"] is True and lines[3]["finished"] == ["a"]
    assert [lane["finished"] for lane in lines[3]["lanes"]] == [["a"], []]
    assert sum(line["retried"] for line in lines) <= 3  # failed admissions back off
    assert_greedy_and_clean(sim, lengths)


class ReversingRunner(FakeRunner):
    """Returns the step's results in reverse row order: results must be matched by id."""

    def execute(self, out: SchedulerOutput) -> tuple[ModelRunnerOutput, Phase | None]:
        result, phase = super().execute(out)
        req_ids = result.req_ids[::-1]
        reversed_result = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=result.sampled_token_ids[::-1],
        )
        return reversed_result, phase


def test_results_are_routed_to_each_lane_by_request_id() -> None:
    sim = engine(3, 2, runner=ReversingRunner())
    lengths = {req_id: (5 + i, 4 + i) for i, req_id in enumerate("abcdef")}
    add_all(sim, lengths)
    assert [sim.scheduler.lane_of(r) for r in "abcdef"] == [0, 1, 2, 0, 1, 2]
    sim.run(100)
    assert_greedy_and_clean(sim, lengths)


def test_async_scheduling_uses_async_lanes_and_keeps_outputs() -> None:
    sim = engine(2, 2, async_scheduling=True, max_model_len=64, num_blocks=6)
    assert all(isinstance(lane, TTAsyncLaneScheduler) for lane in sim.scheduler.lanes)
    lengths = {"a": (16, 24), "b": (16, 24), "c": (16, 24), "d": (40, 5)}
    add_all(sim, lengths)
    records = sim.run(300)
    assert {record.phase for record in records} == {Phase.PREFILL, Phase.DECODE, Phase.EMPTY}
    assert any(record.preempted for record in records)
    assert_greedy_and_clean(sim, lengths)


def test_sync_scheduling_uses_sync_lanes() -> None:
    sim = engine(2, 1)
    assert all(type(lane) is TTLaneScheduler for lane in sim.scheduler.lanes)
    assert [lane.max_num_running_reqs for lane in sim.scheduler.lanes] == [1, 1]
