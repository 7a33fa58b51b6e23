"""Merging lane outputs: every SchedulerOutput field, block renumbering, grammar, results, stats."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from vllm.sampling_params import SamplingParams
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
from vllm.v1.core.sched.output import CachedRequestData, GrammarOutput, NewRequestData, SchedulerOutput
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.metrics.perf import PerfStats
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm_tt_scheduler.compat import HAS_ACCEPTABLE_DRAFTS, HAS_SKIP_DRAFTS, acceptable_drafts, grammar_output
from vllm_tt_scheduler.lanes.merge import MERGED_FIELDS, merge_grammar, merge_outputs
from vllm_tt_scheduler.lanes.results import lane_stats, merge_engine_outputs, merge_stats
from vllm_tt_scheduler.lanes.shape import BlockNumbering

NUMBERING = BlockNumbering(blocks_per_lane=10)


def new_request(req_id: str, blocks: list[int]) -> NewRequestData:
    return NewRequestData(
        req_id=req_id, prompt_token_ids=[1, 2, 3], mm_features=[], sampling_params=SamplingParams(),
        pooling_params=None, block_ids=(blocks,), num_computed_tokens=0, lora_request=None,
    )


def lane_output(new: list[NewRequestData], cached: dict[str, tuple[list[int], ...] | None],
                resumed: set[str] = frozenset(), **fields: object) -> SchedulerOutput:  # type: ignore[assignment]
    scheduled = {n.req_id: 3 for n in new} | {req_id: 1 for req_id in cached}
    out = SchedulerOutput(
        scheduled_new_reqs=new,
        scheduled_cached_reqs=CachedRequestData(
            req_ids=list(cached), resumed_req_ids=set(resumed), new_token_ids=[[] for _ in cached],
            all_token_ids={req_id: [7] for req_id in resumed}, new_block_ids=list(cached.values()),
            num_computed_tokens=[5] * len(cached), num_output_tokens=[2] * len(cached),
        ),
        num_scheduled_tokens=scheduled,
        total_num_scheduled_tokens=sum(scheduled.values()),
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[],  # required before vLLM 0.32
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def two_lanes() -> list[SchedulerOutput]:
    lane0 = lane_output(
        [new_request("a", [1, 2])], {"b": ([3],)},
        finished_req_ids={"x"}, new_block_ids_to_zero=[1, 2, 3], kv_cache_block_copies=[KVCacheBlockCopy(4, 5)],
        skip_drafts=True, free_encoder_mm_hashes=["h0"],
    )
    lane1 = lane_output(
        [new_request("c", [1])], {"d": None, "e": ([2, 3],)}, resumed={"e"},
        finished_req_ids={"y"}, preempted_req_ids={"f"}, new_block_ids_to_zero=[1],
        kv_cache_block_copies=[KVCacheBlockCopy(1, 2)], has_structured_output_requests=True,
        pending_structured_output_tokens=True, skip_drafts=False, free_encoder_mm_hashes=["h1"],
        num_invalid_spec_tokens={"d": 1},
    )
    return [lane0, lane1]


def test_every_scheduler_output_field_has_a_merge_rule() -> None:
    names = {f.name for f in dataclasses.fields(SchedulerOutput)}
    assert names <= MERGED_FIELDS, f"no merge rule for {sorted(names - MERGED_FIELDS)} (new vLLM field?)"


def test_rows_in_lane_order_with_lane_numbered_blocks() -> None:
    merged = merge_outputs(two_lanes(), NUMBERING)
    assert [(n.req_id, n.block_ids) for n in merged.scheduled_new_reqs] == [("a", ([1, 2],)), ("c", ([11],))]
    cached = merged.scheduled_cached_reqs
    assert cached.req_ids == ["b", "d", "e"]
    assert cached.new_block_ids == [([3],), None, ([12, 13],)]
    assert cached.resumed_req_ids == {"e"}
    assert cached.all_token_ids == {"e": [7]}
    assert cached.num_computed_tokens == [5, 5, 5] and cached.num_output_tokens == [2, 2, 2]
    assert len(cached.new_token_ids) == 3
    assert merged.num_scheduled_tokens == {"a": 3, "b": 1, "c": 3, "d": 1, "e": 1}
    assert merged.total_num_scheduled_tokens == 9
    assert merged.new_block_ids_to_zero == [1, 2, 3, 11]
    assert merged.kv_cache_block_copies == [KVCacheBlockCopy(4, 5), KVCacheBlockCopy(11, 12)]
    # The runner finds a new request's lane from its first block.
    assert [NUMBERING.lane_of(n.block_ids[0][0]) for n in merged.scheduled_new_reqs] == [0, 1]


def test_drained_sets_union_and_flags_combine() -> None:
    merged = merge_outputs(two_lanes(), NUMBERING)
    assert merged.finished_req_ids == {"x", "y"}
    assert merged.preempted_req_ids == {"f"}
    assert merged.free_encoder_mm_hashes == ["h0", "h1"]
    assert merged.num_invalid_spec_tokens == {"d": 1}
    assert merged.has_structured_output_requests is True
    assert merged.pending_structured_output_tokens is True
    # lane 1 may use drafts (vLLM < 0.33 has no skip_drafts: drafts are never skipped)
    assert merged.skip_drafts is False if HAS_SKIP_DRAFTS else not hasattr(merged, "skip_drafts")
    assert merged.kv_connector_metadata is None


def test_lane_outputs_keep_their_own_numbering() -> None:
    lanes = two_lanes()
    merge_outputs(lanes, NUMBERING)
    assert lanes[1].scheduled_new_reqs[0].block_ids == ([1],)
    assert lanes[1].scheduled_cached_reqs.new_block_ids == [None, ([2, 3],)]
    assert lanes[1].new_block_ids_to_zero == [1]


def test_empty_lanes_merge_to_an_empty_step() -> None:
    merged = merge_outputs([SchedulerOutput.make_empty(), SchedulerOutput.make_empty()], NUMBERING)
    assert merged.total_num_scheduled_tokens == 0 and not merged.num_scheduled_tokens
    assert merged.preempted_req_ids is None and merged.num_invalid_spec_tokens is None
    assert merged.new_block_ids_to_zero is None and merged.kv_cache_block_copies is None


def test_a_plain_lane_beside_one_with_rare_fields() -> None:
    """Most steps carry none of the rare fields: such a lane takes the short path, and the
    merged dicts and lists are fresh objects, never a lane's own."""
    plain = lane_output([], {"p": None}, skip_drafts=True)
    rare = lane_output([], {"q": None}, skip_drafts=True, scheduled_spec_decode_tokens={"q": [4, 5]},
                       scheduled_encoder_inputs={"q": [0]}, num_spec_tokens_to_schedule=2, has_sync_kv_loads=True)
    merged = merge_outputs([plain, None, rare], NUMBERING)
    assert merged.scheduled_cached_reqs.req_ids == ["p", "q"]
    assert merged.scheduled_spec_decode_tokens == {"q": [4, 5]}
    assert merged.scheduled_encoder_inputs == {"q": [0]}
    assert merged.num_spec_tokens_to_schedule == 2 and merged.has_sync_kv_loads is True
    assert merged.scheduled_spec_decode_tokens is not rare.scheduled_spec_decode_tokens
    assert merged.free_encoder_mm_hashes is not plain.free_encoder_mm_hashes
    if HAS_SKIP_DRAFTS:
        assert merged.skip_drafts is True  # every lane that ran skips them
    only_plain = merge_outputs([plain, lane_output([], {"r": None})], NUMBERING)
    assert only_plain.scheduled_spec_decode_tokens == {} and only_plain.num_spec_tokens_to_schedule == 0
    assert only_plain.has_sync_kv_loads is False and only_plain.scheduled_encoder_input_stats is None


def test_connector_metadata_cannot_be_merged() -> None:
    lanes = two_lanes()
    lanes[1].kv_connector_metadata = object()
    with pytest.raises(RuntimeError, match="lane 1 set SchedulerOutput.kv_connector_metadata"):
        merge_outputs(lanes, NUMBERING)


def grammar(ids: list[str], fill: int, drafts: list[int] | None) -> GrammarOutput:
    return grammar_output(ids, np.full((len(ids), 2), fill, dtype=np.int32), drafts)


def test_grammar_bitmasks_stack_in_lane_order() -> None:
    merged = merge_grammar([grammar(["a"], 1, [0]), None, grammar(["c", "d"], 2, [0, 0])])
    assert merged.structured_output_request_ids == ["a", "c", "d"]
    assert merged.grammar_bitmask.tolist() == [[1, 1], [2, 2], [2, 2]]
    assert acceptable_drafts(merged) == ([0, 0, 0] if HAS_ACCEPTABLE_DRAFTS else None)
    assert merge_grammar([None, None]) is None
    assert acceptable_drafts(merge_grammar([grammar(["a"], 1, None), grammar(["b"], 1, [0])])) is None


def output(req_id: str) -> EngineCoreOutput:
    return EngineCoreOutput(request_id=req_id, new_token_ids=[1])


def test_engine_outputs_merge_per_client_with_one_stats_record() -> None:
    lane0 = {0: EngineCoreOutputs(outputs=[output("a")], scheduler_stats=SchedulerStats(num_running_reqs=1))}
    lane1 = {
        0: EngineCoreOutputs(outputs=[output("b")], finished_requests={"b"}),
        1: EngineCoreOutputs(outputs=[output("c")], finished_requests={"c"}),
    }
    assert lane_stats(lane0).num_running_reqs == 1 and lane_stats(lane1) is None
    stats = SchedulerStats(num_running_reqs=3)
    merged = merge_engine_outputs([lane0, lane1], stats)
    assert sorted(merged) == [0, 1]
    assert [o.request_id for o in merged[0].outputs] == ["a", "b"]
    assert merged[0].finished_requests == {"b"} and merged[1].finished_requests == {"c"}
    assert merged[0].scheduler_stats is stats and merged[1].scheduler_stats is None
    assert merge_engine_outputs([{}, {}], None) == {}
    only_stats = merge_engine_outputs([{}, {}], stats)
    assert list(only_stats) == [0] and only_stats[0].scheduler_stats is stats and not only_stats[0].outputs


def test_stats_sum_counts_and_average_kv_usage() -> None:
    def lane(running: int, waiting: int, usage: float, hits: int) -> SchedulerStats:
        return SchedulerStats(
            num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage,
            prefix_cache_stats=PrefixCacheStats(requests=1, queries=10, hits=hits),
            perf_stats=PerfStats(num_flops_per_gpu=5),
        )

    merged = merge_stats([lane(2, 1, 0.5, 3), lane(1, 0, 0.25, 4)])
    assert (merged.num_running_reqs, merged.num_waiting_reqs) == (3, 1)
    assert merged.kv_cache_usage == pytest.approx(0.375)
    prefix = merged.prefix_cache_stats
    assert (prefix.requests, prefix.queries, prefix.hits) == (2, 20, 7)
    assert merged.perf_stats.num_flops_per_gpu == 10
    assert merge_stats([None, None]) is None
