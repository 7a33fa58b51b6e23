"""The runner's persistent batch and step plans: slots for life, lanes, preemption and resume,
fixed-shape inputs, and the mixed-step invariant."""

from __future__ import annotations

import pytest
import torch
from vllm.sampling_params import SamplingParams
from vllm_tt_platform.runner.batch import BlockCopiesError, PersistentBatch, SlotsExhaustedError
from vllm_tt_platform.runner.step import DecodeInputs, PrefillInputs, StepPlan
from vllm_tt_scheduler.phase import MixedStepError, Phase
from vllm_tt_testing.scheduler_outputs import cached_requests as cached
from vllm_tt_testing.scheduler_outputs import new_request as new
from vllm_tt_testing.scheduler_outputs import scheduler_output as step


def test_requests_keep_their_slot_and_free_it_when_finished():
    batch = PersistentBatch(lanes=1, rows_per_lane=2)
    batch.update(step([new("a", [1, 2, 3], [1]), new("b", [4, 5], [2])], scheduled={"a": 3, "b": 2}))
    assert (batch.requests["a"].slot, batch.requests["b"].slot) == (0, 1)
    with pytest.raises(SlotsExhaustedError):
        batch.update(step([new("c", [6], [3])], scheduled={"c": 1}))
    _, _, released = batch.update(step(finished={"a"}))
    assert [s.req_id for s in released] == ["a"]
    batch.update(step([new("d", [7], [4])], scheduled={"d": 1}))
    assert batch.requests["d"].slot == 0 and batch.requests["b"].slot == 1


def test_lanes_own_their_rows():
    batch = PersistentBatch(lanes=2, rows_per_lane=2)
    batch.update(step([new("a", [1], [1]), new("b", [2], [9])], scheduled={"a": 1, "b": 1}), {"a": 1, "b": 1})
    assert sorted(s.slot for s in batch) == [2, 3]


def test_preempted_request_resumes_with_scheduler_tokens_and_new_blocks():
    batch = PersistentBatch(lanes=1, rows_per_lane=1)
    batch.update(step([new("a", [1, 2], [5])], scheduled={"a": 2}))
    batch.requests["a"].output_token_ids.extend([7, 8, 9])
    _, _, released = batch.update(step(preempted={"a"}))
    assert [s.req_id for s in released] == ["a"] and "a" not in batch.requests
    batch.update(step([new("b", [3], [6])], scheduled={"b": 1}))
    batch.update(step(finished={"b"}))
    added, resumed, _ = batch.update(step(
        cached=cached(["a"], [0], new_blocks=[([11, 12],)], resumed={"a"}, all_tokens={"a": [1, 2, 7, 8]}),
        scheduled={"a": 4},
    ))
    state = batch.requests["a"]
    assert [s.req_id for s in resumed] == ["a"] and state.slot == 0
    assert state.output_token_ids == [7, 8], "the scheduler's token list wins over stale in-flight tokens"
    assert state.block_ids == [11, 12]


def test_decode_inputs_are_the_full_fixed_batch():
    batch = PersistentBatch(lanes=1, rows_per_lane=4)
    batch.update(step([new("a", [1, 2, 3], [1]), new("b", [4, 5], [2])], scheduled={"a": 3, "b": 2}))
    batch.requests["a"].output_token_ids.append(40)
    batch.requests["b"].output_token_ids.append(50)
    out = step(cached=cached(["a", "b"], [3, 2]), scheduled={"a": 1, "b": 1})
    batch.update(out)
    plan = StepPlan.build(out, batch)
    assert plan.phase is Phase.DECODE
    inputs = DecodeInputs.build(plan.rows, num_slots=4, table_width=3, blocks_per_lane=100)
    assert inputs.tokens[:, 0].tolist() == [40, 50, 0, 0]
    assert inputs.start_pos.tolist() == [3, 2, -1, -1]
    assert inputs.page_table.tolist() == [[1, 0, 0], [2, 0, 0], [0, 0, 0], [0, 0, 0]]


def test_prefill_chunk_inputs_and_intermediate_chunks():
    batch = PersistentBatch(lanes=1, rows_per_lane=2)
    out = step([new("a", list(range(10, 20)), [3, 4])], scheduled={"a": 6})
    batch.update(out)
    plan = StepPlan.build(out, batch)
    assert plan.phase is Phase.PREFILL and not plan.rows[0].produces_token
    inputs = PrefillInputs.build(plan.rows, table_width=4, blocks_per_lane=100)
    assert inputs.prompt_lens.tolist() == [6] and inputs.start_pos.tolist() == [0]
    assert inputs.tokens[0].tolist() == list(range(10, 16))
    out = step(cached=cached(["a"], [6]), scheduled={"a": 4})
    batch.update(out)
    plan = StepPlan.build(out, batch)
    assert plan.phase is Phase.PREFILL and plan.rows[0].produces_token
    assert PrefillInputs.build(plan.rows, 4, 100).start_pos.tolist() == [6]


def test_lane_numbered_blocks_become_lane_local():
    batch = PersistentBatch(lanes=2, rows_per_lane=1)
    batch.update(step([new("a", [1, 2], [17, 18])], scheduled={"a": 2}), {"a": 1})
    table = PrefillInputs.build(StepPlan.build(step(scheduled={"a": 2}), batch).rows, 3, blocks_per_lane=16).page_table
    assert table.tolist() == [[1, 2, 0]]


def test_mixed_step_is_refused():
    batch = PersistentBatch(lanes=1, rows_per_lane=2)
    batch.update(step([new("a", [1, 2], [1])], scheduled={"a": 2}))
    batch.requests["a"].output_token_ids.append(9)
    out = step([new("b", [3, 4, 5], [2])], cached(["a"], [2]), scheduled={"a": 1, "b": 3})
    batch.update(out)
    with pytest.raises(MixedStepError):
        StepPlan.build(out, batch)


def test_last_prompt_token_alone_is_still_prefill():
    """A chunk that left one prompt token: the next step carries it beside new prompts (the
    scheduler's prefill pass), though its counts look like a decode's."""
    batch = PersistentBatch(lanes=1, rows_per_lane=2)
    out = step([new("a", [1, 2, 3], [1])], scheduled={"a": 2})
    batch.update(out)
    assert not StepPlan.build(out, batch).rows[0].produces_token
    out = step([new("b", [4, 5], [2])], cached(["a"], [2]), scheduled={"a": 1, "b": 2})
    batch.update(out)
    plan = StepPlan.build(out, batch)
    assert plan.phase is Phase.PREFILL and all(row.produces_token for row in plan.rows)
    batch.requests["a"].output_token_ids.append(9)
    batch.requests["b"].output_token_ids.append(8)
    out = step(cached=cached(["a", "b"], [3, 2]), scheduled={"a": 1, "b": 1})
    batch.update(out)
    assert StepPlan.build(out, batch).phase is Phase.DECODE


def test_seeded_requests_get_their_own_generator():
    batch = PersistentBatch(lanes=1, rows_per_lane=1)
    req = new("a", [1], [1])
    req.sampling_params = SamplingParams(seed=7, temperature=1.0)
    batch.update(step([req], scheduled={"a": 1}))
    gen = batch.requests["a"].generator
    assert isinstance(gen, torch.Generator) and gen.initial_seed() == 7


def test_block_copies_vllm_asks_for_are_an_error_not_skipped():
    """A copy the runner skipped would leave a prefix hit reading a state never written there."""
    from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

    out = step([new("a", [1, 2, 3], [1])], scheduled={"a": 3})
    out.kv_cache_block_copies = [KVCacheBlockCopy(src_block_id=4, dst_block_id=9)]
    with pytest.raises(BlockCopiesError, match=r"copy KV blocks \[\(4, 9\)\].*--prefix-match-unit"):
        PersistentBatch(1, 2).update(out)
