"""Speculative decoding in lane mode: the runner's drafts reach the lane holding each row, a
verify step is one decode step over every lane's rows, and vLLM's acceptance counts cover
every lane."""

from __future__ import annotations

import functools

from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm_tt_scheduler import TTLaneCoordinator
from vllm_tt_scheduler.lanes.drafts import route_drafts
from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler, make_request

K = 3


def spec_coordinator(lanes: int = 2, rows: int = 2, async_scheduling: bool = False,
                     proposer: str | None = None) -> TTLaneCoordinator:
    config = SimConfig(max_num_seqs=lanes * rows, tt={"_lanes": lanes, "_rows_per_lane": rows},
                       num_speculative_tokens=K, async_scheduling=async_scheduling, spec_proposer=proposer)
    return build_scheduler(functools.partial(TTLaneCoordinator, log_stats=True), config)


def test_route_drafts_splits_by_holding_lane_in_order() -> None:
    drafts = DraftTokenIds(["a", "b", "gone", "c", "d"], [[1], [2, 3], [4], [5], []])
    routed = route_drafts(drafts, [{"b", "d"}, set(), {"a", "c"}])
    assert routed[1] is None
    assert (routed[0].req_ids, routed[0].draft_token_ids) == (["b", "d"], [[2, 3], []])
    assert (routed[2].req_ids, routed[2].draft_token_ids) == (["a", "c"], [[1], [5]])
    assert route_drafts(DraftTokenIds(["gone"], [[1]]), [{"a"}, {"b"}]) == [None, None]


def _prefilled(sched: TTLaneCoordinator) -> Engine:
    sim = Engine(sched)
    for req_id in "abcd":  # lanes 0, 1, 0, 1
        sim.add(make_request(req_id, 8, 20))
    sim.step()
    assert [sched.lane_of(r) for r in "abcd"] == [0, 1, 0, 1]
    return sim


def test_the_models_own_drafter_gets_k_lookahead_slots_in_every_lane() -> None:
    """``custom_class`` (the model's own drafter) writes its K drafts' KV past the scheduled
    tokens, so every lane's allocation reserves K more slots: a one-block prompt holds a second
    block for them; n-gram drafts write nothing and reserve nothing."""
    for proposer, lookahead, blocks in ((None, 0, 1), ("pkg.ModelDrafts", K, 2)):
        sched = spec_coordinator(proposer=proposer)
        sim = Engine(sched)
        for req_id in "ab":  # lanes 0, 1
            sim.add(make_request(req_id, SimConfig.block_size, 20))
        sim.step()
        for lane, req_id in enumerate("ab"):
            scheduler = sched.lanes[lane]
            assert scheduler.num_lookahead_tokens == lookahead
            held = scheduler.kv_cache_manager.get_blocks(req_id).get_block_ids()[0]
            assert len(held) == blocks, (proposer, lane, held)


def test_verify_step_carries_every_lane_s_drafts_and_counts_every_lane_s_acceptance() -> None:
    sched = spec_coordinator()
    _prefilled(sched)
    drafts = {"a": [11, 12, 13], "b": [21, 22, 23], "c": [31, 32], "d": [41, 42, 43]}
    sched.update_draft_token_ids(DraftTokenIds([*drafts, "gone"], [*drafts.values(), [9]]))
    for lane, held in ((0, "ac"), (1, "bd")):
        assert {r: sched.lanes[lane].requests[r].spec_token_ids for r in held} == {r: drafts[r] for r in held}

    out = sched.schedule()
    assert out.scheduled_spec_decode_tokens == drafts
    assert out.num_scheduled_tokens == {r: 1 + len(d) for r, d in drafts.items()}  # one verify step
    assert not out.scheduled_new_reqs

    # a: 2 drafts accepted, b: none, c: both, d: all three (plus each row's own token)
    sampled = {"a": [11, 12, 5], "b": [6], "c": [31, 32, 7], "d": [41, 42, 43, 8]}
    ids = list(out.num_scheduled_tokens)
    runner_out = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=[sampled[r] for r in ids])
    results = sched.update_from_output(out, runner_out)
    records = [eco.scheduler_stats for eco in results.values() if eco.scheduler_stats is not None]
    assert len(records) == 1
    spec = records[0].spec_decoding_stats
    assert (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens) == (4, 11, 7)
    assert spec.num_accepted_tokens_per_pos == [3, 3, 1]
    assert spec.num_draft_tokens_per_pos == [4, 4, 3]
    for req_id, tokens in sampled.items():
        assert sched.requests[req_id].output_token_ids[-len(tokens):] == tokens


def test_async_lanes_fill_their_own_placeholders() -> None:
    """Under async scheduling vLLM schedules placeholder drafts, then hands the real ones in
    with the step in flight: each lane fills only its rows' placeholders."""
    sched = spec_coordinator(async_scheduling=True)
    sim = Engine(sched)
    for req_id in "abcd":
        sim.add(make_request(req_id, 8, 20))
    first = sched.schedule()
    runner_out, _ = sim.runner.execute(first)
    second = sched.schedule()  # scheduled before the first step's output is processed
    sched.update_from_output(first, runner_out)
    assert set(second.scheduled_spec_decode_tokens) == set("abcd")
    assert all(ids == [-1] * K for ids in second.scheduled_spec_decode_tokens.values())
    drafts = {"a": [11, 12, 13], "b": [21, 22], "d": [41, 42, 43]}
    sched.update_draft_token_ids_in_output(DraftTokenIds(list(drafts), [list(d) for d in drafts.values()]), second)
    assert second.scheduled_spec_decode_tokens == {"a": [11, 12, 13], "b": [21, 22, -1], "c": [-1] * K,
                                                   "d": [41, 42, 43]}
    assert second.num_invalid_spec_tokens == {"b": 1}
