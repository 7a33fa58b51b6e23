"""Will vLLM's KV allocator take a waiting request right now? A cheap, honest guess.

Lets the phase decision skip a prefill pass that could admit nothing (the obvious way
runs it, fails, then runs a decode pass: twice the host work on every KV-bound step).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.utils.math_utils import cdiv
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.request import Request


@dataclass(frozen=True)
class KVFit:
    """Predicts whether vLLM's allocator will take a waiting request right now.

    Exact only for a single full-attention KV group without prefix caching; anything
    else answers "try it" and lets a zero-token prefill pass fall back to decode.
    """

    exact: bool
    block_size: int
    full_sequence: bool
    """vLLM's ``scheduler_reserve_full_isl``: admission needs the whole prompt's blocks."""

    @classmethod
    def for_scheduler(cls, sched: Scheduler) -> KVFit:
        groups = sched.kv_cache_config.kv_cache_groups
        spec = groups[0].kv_cache_spec if len(groups) == 1 else None
        exact = (
            isinstance(spec, FullAttentionSpec)
            and spec.sliding_window is None
            and spec.attention_chunk_size is None
            and not sched.cache_config.enable_prefix_caching
        )
        block_size = spec.block_size if spec is not None else sched.block_size
        return cls(exact, block_size, bool(sched.scheduler_reserve_full_isl))

    def fits(self, sched: Scheduler, request: Request, chunk_tokens: int) -> bool:
        """Whether the request's first chunk (or whole prompt) gets blocks now."""
        if not self.exact or request.num_computed_tokens > 0:
            return True
        num_tokens = min(request.num_tokens, sched.max_model_len)
        if not self.full_sequence:
            num_tokens = min(num_tokens, chunk_tokens)
        needed = cdiv(num_tokens, self.block_size)
        if sched.running:
            needed += sched.kv_cache_manager.watermark_blocks
        return needed <= sched.kv_cache_manager.block_pool.get_num_free_blocks()
