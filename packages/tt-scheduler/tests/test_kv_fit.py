"""``KVFit``: the phase scheduler's admission guess equals what vLLM's allocator then does, for
full-attention, sliding-window and mixed (hybrid) KV cache groups, with and without vLLM's
full-sequence admission gate; it answers "try it" where it cannot know."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    SlidingWindowSpec,
)
from vllm.v1.structured_output import StructuredOutputManager
from vllm_tt_scheduler.kv_fit import KVFit
from vllm_tt_testing.scheduler_sim import SimConfig, build_vllm_config, make_request

BLOCK = 16
WINDOW = 20
CHUNK = 64
NUM_BLOCKS = 120
COMMON = {"block_size": BLOCK, "num_kv_heads": 2, "head_size": 16, "dtype": torch.float32}
FULL = FullAttentionSpec(**COMMON)
SLIDING = SlidingWindowSpec(**COMMON, sliding_window=WINDOW)
GROUPS: dict[str, tuple[KVCacheSpec, ...]] = {
    "full": (FULL,),
    "sliding": (SLIDING,),
    "sliding+full": (SLIDING, FULL),
    "3 sliding+full": (SLIDING, SLIDING, SLIDING, FULL),
}


def scheduler(specs: tuple[KVCacheSpec, ...], full_sequence: bool = False, prefix_caching: bool = False,
              ) -> Scheduler:
    config = SimConfig(max_num_seqs=8, max_num_batched_tokens=CHUNK, max_model_len=256, block_size=BLOCK,
                       num_blocks=NUM_BLOCKS, enable_prefix_caching=prefix_caching)
    vllm_config = build_vllm_config(config)
    kv_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"model.layers.{i}.self_attn"], spec) for i, spec in enumerate(specs)],
    )
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_config,
                      structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)
    sched.scheduler_reserve_full_isl = full_sequence
    return sched


def allocator_takes(sched: Scheduler, prompt_len: int, full_sequence: bool) -> tuple[bool, bool]:
    """(KVFit's answer, what vLLM's allocate_slots did) for a fresh request's first chunk."""
    request = make_request(f"probe-{prompt_len}", prompt_len, 8)
    predicted = KVFit.for_scheduler(sched).fits(sched, request, CHUNK)
    manager = sched.kv_cache_manager
    blocks = manager.allocate_slots(request, min(prompt_len, CHUNK), full_sequence_must_fit=full_sequence,
                                    has_scheduled_reqs=bool(sched.running))
    if blocks is not None:
        manager.free(request)
    return predicted, blocks is not None


def hold_until(sched: Scheduler, free_target: int) -> list:
    """Allocate holder requests (one block-sized step at a time) until at most ``free_target``
    blocks are free; they are put in ``running``, so vLLM's watermark applies to admissions."""
    manager = sched.kv_cache_manager
    holders = []
    while manager.block_pool.get_num_free_blocks() > free_target:
        holder = make_request(f"holder-{len(holders)}", BLOCK, 8)
        if manager.allocate_slots(holder, BLOCK) is None:
            break
        holders.append(holder)
    sched.running = holders
    return holders


@pytest.mark.parametrize("full_sequence", [False, True], ids=["first chunk", "full sequence"])
@pytest.mark.parametrize("groups", list(GROUPS))
def test_the_guess_is_what_vllms_allocator_does(groups: str, full_sequence: bool) -> None:
    sched = scheduler(GROUPS[groups], full_sequence)
    assert KVFit.for_scheduler(sched).exact
    manager = sched.kv_cache_manager
    outcomes = set()
    for free_target in (NUM_BLOCKS, 60, 30, 20, 17, 16, 12, 8, 5, 2, 0):
        holders = hold_until(sched, free_target)
        for prompt_len in (1, 15, 16, 17, 40, 64, 100, 200, 256):
            predicted, taken = allocator_takes(sched, prompt_len, full_sequence)
            free = manager.block_pool.get_num_free_blocks()
            assert predicted == taken, f"{groups}: {prompt_len} tokens with {free} blocks free"
            outcomes.add(taken)
        for holder in holders:
            manager.free(holder)
        sched.running = []
    assert outcomes == {True, False}, "the sweep never filled the pool: the test proves nothing"


def test_sliding_groups_need_only_their_window_under_the_full_sequence_gate() -> None:
    sched = scheduler(GROUPS["sliding+full"], full_sequence=True)
    request = make_request("long", 256, 8)
    full_only = KVFit.blocks_needed(scheduler(GROUPS["full"]), request, 256, admission=True)
    both = KVFit.blocks_needed(sched, request, 256, admission=True)
    cap = SLIDING.max_admission_blocks_per_request(sched.vllm_config.max_in_flight_tokens, 256)
    assert (full_only, both) == (256 // BLOCK, 256 // BLOCK + cap)
    assert cap < 256 // BLOCK


def test_counting_changes_nothing_in_vllm() -> None:
    sched = scheduler(GROUPS["sliding+full"], full_sequence=True)
    manager = sched.kv_cache_manager
    request = make_request("a", 100, 8)
    free = manager.block_pool.get_num_free_blocks()
    KVFit.for_scheduler(sched).fits(sched, request, CHUNK)
    assert manager.block_pool.get_num_free_blocks() == free
    assert all(request.request_id not in m.req_to_blocks for m in manager.coordinator.single_type_managers)


@pytest.mark.parametrize("case", ["prefix caching", "chunked local attention"])
def test_unknowable_cases_answer_try_it(case: str) -> None:
    if case == "prefix caching":
        sched = scheduler(GROUPS["sliding+full"], prefix_caching=True)
    else:
        sched = scheduler((ChunkedLocalAttentionSpec(**COMMON, attention_chunk_size=32), FULL))
    fit = KVFit.for_scheduler(sched)
    assert not fit.exact
    assert fit.fits(sched, make_request("huge", 256, 8), CHUNK)
