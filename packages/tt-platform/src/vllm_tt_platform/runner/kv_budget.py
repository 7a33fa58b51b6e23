"""``KVBudget``: how many KV blocks one lane gets, planned per KV cache group.

vLLM's hybrid KV cache manager draws every group's blocks from one pool, so a request holds
blocks in each group at once: in a full-attention group its whole sequence, in a sliding-window
group at most the window plus the tokens in flight (vLLM's per-request admission cap), in a
recurrent-state group (``MambaSpec``) one block whatever its length (two with prefix caching:
vLLM's ``align`` mode keeps the last step's state while the step writes the next; the states it
caches at block boundaries sit in the free pool, as cached attention blocks do). Each full
or latent-attention (MLA) group gets the model's token pool (``get_max_tokens_all_users``,
tt-metal's sizing) plus one block of headroom per row; each sliding group gets room for every
row at its cap. tt-metal adds
sliding headroom of the same kind (``W x rows x 8`` tokens, for a group count it cannot know
yet); here vLLM's own grouping of the spec gives the groups exactly.

The block count reaches vLLM exactly (``cache_config.num_gpu_blocks_override``, unless the user
set it), so nothing depends on guessing how vLLM turns bytes into blocks for a group layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.config import VllmConfig
from vllm.utils.math_utils import cdiv
from vllm.v1.kv_cache_interface import (
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from vllm_tt_platform import compat


@dataclass(frozen=True)
class GroupBudget:
    kind: str
    """``full``, ``sliding``, ``mla`` (latent attention: sized like full attention, one
    latent per token instead of K and V) or ``recurrent`` (one or two state blocks per request)."""
    num_layers: int
    sliding_window: int | None
    blocks: int
    """Blocks the group may hold across the lane's rows."""
    blocks_per_request: int
    """Blocks one request of ``max_model_len`` tokens holds in the group at most."""

    def describe(self) -> str:
        kind = self.kind if self.sliding_window is None else f"{self.kind}(W={self.sliding_window})"
        return f"{kind} x{self.num_layers} layers: {self.blocks}"


@dataclass(frozen=True)
class KVBudget:
    groups: tuple[GroupBudget, ...]
    blocks: int
    """Per lane, vLLM's null block included."""
    bytes_per_block: int
    """What one block costs across the pool's layers (vLLM's uniform-page layout)."""

    @property
    def bytes(self) -> int:
        return self.blocks * self.bytes_per_block

    @classmethod
    def plan(cls, vllm_config: VllmConfig, spec: dict[str, KVCacheSpec], pool_tokens: int,
             rows: int) -> KVBudget:
        """The budget of a lane serving ``rows`` requests, for a model whose full-attention
        layers want ``pool_tokens`` tokens of KV across those rows."""
        max_model_len = vllm_config.model_config.max_model_len
        in_flight = vllm_config.max_in_flight_tokens
        groups = []
        bytes_per_block = 0
        for group in compat.kv_cache_groups(vllm_config, spec):
            group_spec = group.kv_cache_spec
            if isinstance(group_spec, UniformTypeKVCacheSpecs):  # per-layer shapes, one tensor each
                bytes_per_block = max(bytes_per_block, group_spec.page_size_bytes)
                group_spec = next(iter(group_spec.kv_cache_specs.values()))
            else:
                bytes_per_block = max(bytes_per_block, group_spec.page_size_bytes * len(group.layer_names))
            size = group_spec.block_size
            if isinstance(group_spec, SlidingWindowSpec):
                cap = group_spec.max_admission_blocks_per_request(in_flight, max_model_len)
                groups.append(GroupBudget("sliding", len(group.layer_names), group_spec.sliding_window,
                                          rows * cap, cap))
            elif isinstance(group_spec, MambaSpec):
                per_request = group_spec.max_memory_usage_bytes(vllm_config) // group_spec.page_size_bytes
                groups.append(GroupBudget("recurrent", len(group.layer_names), None, rows * per_request,
                                          per_request))
            else:
                kind = "mla" if isinstance(group_spec, MLAAttentionSpec) else "full"
                groups.append(GroupBudget(kind, len(group.layer_names), None,
                                          cdiv(pool_tokens + size * rows, size), cdiv(max_model_len, size)))
        # vLLM refuses to start unless one max_model_len request fits (besides the null block).
        blocks = max(sum(g.blocks for g in groups), sum(g.blocks_per_request for g in groups)) + 1
        return cls(tuple(groups), blocks, bytes_per_block)

    def describe(self) -> str:
        return f"{self.blocks} blocks/lane = " + " + ".join(g.describe() for g in self.groups) + " + null"
