"""Will vLLM's KV allocator take a waiting request right now? A cheap, honest answer.

Lets the phase decision skip a prefill pass that could admit nothing (the obvious way
runs it, fails, then runs a decode pass: twice the host work on every KV-bound step).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from vllm.v1.request import Request


def _countable(spec: KVCacheSpec) -> bool:
    """Full attention (every block kept) or a sliding window: kinds whose block count for a
    fresh request depends on its token count alone."""
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return all(_countable(s) for s in spec.kv_cache_specs.values())
    if isinstance(spec, SlidingWindowSpec):
        return True
    return isinstance(spec, FullAttentionSpec) and spec.attention_chunk_size is None


@dataclass(frozen=True)
class KVFit:
    """Predicts whether vLLM's allocator will take a waiting request right now.

    Exact for full-attention and sliding-window KV groups (any mix of them, vLLM's hybrid KV
    cache manager included) without prefix caching: vLLM's own KV cache coordinator counts the
    blocks (``get_num_blocks_to_allocate``, a pure count over the request's token count, the one
    ``allocate_slots`` checks: the whole sequence under vLLM's sliding-window admission cap when
    ``scheduler_reserve_full_isl``, then the first chunk). With prefix caching the blocks a hit
    saves are only known after vLLM's cache lookup, which also counts as a query in vLLM's
    prefix-cache statistics; that and other KV kinds (chunked local attention, Mamba) answer
    "try it" and let a zero-token prefill pass fall back to decode.
    """

    exact: bool
    full_sequence: bool
    """vLLM's ``scheduler_reserve_full_isl``: admission needs the whole prompt's blocks."""

    @classmethod
    def for_scheduler(cls, sched: Scheduler) -> KVFit:
        groups = sched.kv_cache_config.kv_cache_groups
        exact = (
            bool(groups)
            and all(_countable(group.kv_cache_spec) for group in groups)
            and not sched.cache_config.enable_prefix_caching
        )
        return cls(exact, bool(sched.scheduler_reserve_full_isl))

    def fits(self, sched: Scheduler, request: Request, chunk_tokens: int) -> bool:
        """Whether the request's first chunk (or whole prompt) gets blocks now."""
        if not self.exact or request.num_computed_tokens > 0:
            return True
        manager = sched.kv_cache_manager
        free = manager.block_pool.get_num_free_blocks()
        if sched.running:
            free -= manager.watermark_blocks
        num_tokens = min(request.num_tokens, sched.max_model_len)
        if self.full_sequence and self.blocks_needed(sched, request, num_tokens, admission=True) > free:
            return False
        return self.blocks_needed(sched, request, min(num_tokens, chunk_tokens)) <= free

    @staticmethod
    def blocks_needed(sched: Scheduler, request: Request, num_tokens: int, admission: bool = False) -> int:
        """Blocks the coordinator would allocate, over every KV cache group, for the first
        ``num_tokens`` tokens of a request holding none; ``admission``: under vLLM's per-request
        sliding-window cap (its full-sequence admission gate)."""
        manager = sched.kv_cache_manager
        return manager.coordinator.get_num_blocks_to_allocate(
            request_id=request.request_id,
            num_tokens=num_tokens,
            new_computed_blocks=manager.empty_kv_cache_blocks.blocks,
            num_encoder_tokens=0,
            total_computed_tokens=0,
            num_local_computed_tokens=0,
            num_tokens_main_model=num_tokens,
            apply_admission_cap=admission,
            prefill_end=max(request.num_prompt_tokens, request.num_tokens - 1),
        )
