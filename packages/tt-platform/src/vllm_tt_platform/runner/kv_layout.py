"""``KVLayout``: the KV cache vLLM planned, as the runner serves it to the model.

vLLM's hybrid KV cache manager keeps one block table per KV cache group (one group per attention
kind, e.g. full and sliding window) and overlays the groups in one pool: a block id belongs to
one group at a time, so the i-th layer of every group can live in the same storage. This module
reads that plan once (``KVLayout.of``) and answers the runner's three questions: which storage
each layer uses (``per_layer_specs``, tt-metal's ``allocate_kv_cache_per_layer`` argument),
which group's table each layer reads, and which table entries a sliding-window group may still
read (``KVGroup.first_live_block``: vLLM frees the blocks a window has left behind and gives them
to other requests, so the runner zeroes them, i.e. points them at vLLM's null block 0). A
recurrent-state group's row is sent as the two state blocks of the step (``KVGroup.state_blocks``).
A layer that reads another layer's KV (vLLM's cross-layer KV sharing) is not in vLLM's plan:
it joins its target's group and storage, as vLLM's GPU runner binds it to its target's tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from vllm_tt_platform.errors import TTUnsupportedFeatureError

KVShape = tuple[int, int, int, int]
"""``(num_blocks, num_kv_heads_per_device, block_size, head_dim)`` of one layer's K (and V)."""

StateShapes = tuple[tuple[int, ...], ...]
"""A recurrent-state layer's tensors (vLLM's ``MambaSpec.shapes``), each with the block count
first: ``((num_blocks, *conv_shape), (num_blocks, *state_shape))`` for a gated delta-net."""

KVDtype = torch.dtype | tuple[torch.dtype, ...]
"""A layer's dtype, or a recurrent-state layer's dtype per state."""

LayerKVSpec = tuple[KVShape | StateShapes, KVDtype, int]
"""``(shape, dtype, tensor_idx)``: one entry of ``allocate_kv_cache_per_layer``'s argument; a
recurrent-state layer has its state shapes and dtypes."""

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


def layer_index(name: str) -> int:
    """The decoder layer a KV cache layer name (``model.layers.{i}.self_attn``) belongs to."""
    match = _LAYER_INDEX.search(name)
    if match is None:
        raise TTUnsupportedFeatureError(
            "get_kv_cache_spec() layer name", name, "names containing 'layers.<index>' "
            "(model.layers.{i}.self_attn)", "key the model's KV cache spec by decoder layer",
        )
    return int(match.group(1))


@dataclass(frozen=True)
class KVGroup:
    """One KV cache group: layers sharing one block table (and so one attention kind)."""

    index: int
    layers: tuple[int, ...]
    block_size: int
    sliding_window: int | None
    """The window ``W`` of a sliding group (a token attends to itself and ``W - 1`` before it)."""
    retained_tokens: int = 0
    """Tokens below a request's first scheduled position its attention still reads (vLLM's
    ``SlidingWindowSpec.num_retained_tokens``); only meaningful for a sliding group."""
    latent: bool = False
    """Multi-head latent attention (``MLAAttentionSpec``): one latent per token, one "head",
    no separate V; paged like full attention."""
    recurrent: bool = False
    """A fixed-size per-request state (``MambaSpec``, e.g. Qwen 3.5's gated delta-net), sent as
    ``state_blocks``: entry 0 of the row the state the step starts from, entry 1 where it ends."""
    state_boundaries: bool = False
    """A recurrent group in vLLM's ``align`` cache mode (prefix caching on): its table is
    position-indexed, entry ``j`` the state after ``(j + 1) * block_size`` tokens, so every
    block boundary a step ends on leaves a state vLLM can cache; otherwise one block per
    request holds the running state."""
    state_slots: int = 1
    """A recurrent group without ``state_boundaries``: the state blocks of a request (vLLM's
    ``1 + num_speculative_blocks``: ``1 + K`` with speculative decoding), a ring by position:
    the state after position ``q`` sits in block ``q % state_slots``. A verify step writes the
    state after each of its positions, and the next step reads the one of the last position
    vLLM kept, so a rejected draft never reaches the state and nothing tracks acceptance."""
    cross: bool = False
    """Cross-attention (``CrossAttentionSpec``, an encoder-decoder model's): the blocks of the
    request's encoder states (Mllama's vision keys), allocated once, sent as ``cross_page_table``."""

    @property
    def kind(self) -> Literal["full", "sliding", "mla", "recurrent", "cross"]:
        if self.cross:
            return "cross"
        if self.recurrent:
            return "recurrent"
        if self.latent:
            return "mla"
        return "full" if self.sliding_window is None else "sliding"

    def first_live_block(self, num_computed_tokens: int) -> int:
        """Table entries below this one are out of the window of every token from
        ``num_computed_tokens`` on: vLLM may have freed them (as vLLM's own GPU block table
        masks them)."""
        if self.sliding_window is None:
            return 0
        return max(num_computed_tokens - self.retained_tokens, 0) // self.block_size

    def state_blocks(self, ids: Sequence[int], start: int, end: int) -> tuple[int, ...]:
        """A recurrent row's blocks for a step computing ``[start, end)``: ``(read, write,
        ...)``, the state after ``start`` tokens and the block the state after ``end`` goes to.
        In ``align`` mode that is vLLM's GPU-runner rule (``preprocess_mamba`` copies the block
        of token ``start - 1`` into the block of token ``end - 1`` before the kernel runs in
        place): read there, write here; a prefix hit of ``k`` blocks reads cached entry
        ``k - 1``. The read block at ``start`` 0 is the null block (the model starts from
        zeros). Otherwise the ring of ``state_slots`` blocks: read the slot of position
        ``start - 1``, then the slots of the ``state_slots`` positions from ``end - 1`` on
        (entry ``1 + j``: where a verify step's position ``j`` leaves its state)."""
        if self.state_boundaries:
            read = ids[(start - 1) // self.block_size] if start > 0 else 0
            return read, ids[(end - 1) // self.block_size]
        ring = ids[: self.state_slots]
        n = len(ring)
        return (ring[(start - 1) % n] if start > 0 else ring[0], *(ring[(end - 1 + j) % n] for j in range(n)))

    def describe(self) -> str:
        kind = self.kind if self.sliding_window is None else f"sliding(W={self.sliding_window})"
        if self.state_boundaries:
            kind = f"recurrent(a state per {self.block_size}-token block)"
        elif self.state_slots > 1:
            kind = f"recurrent({self.state_slots} state slots per request, one per verify position)"
        return f"{kind} layers {list(self.layers)}"


@dataclass(frozen=True)
class LayerKV:
    group: int
    shape: KVShape | StateShapes
    dtype: KVDtype
    tensor_idx: int
    """Layers with the same index share storage (vLLM overlays them in one pool)."""


@dataclass(frozen=True)
class KVLayout:
    groups: tuple[KVGroup, ...]
    layers: tuple[LayerKV, ...]
    """In layer order."""

    shared: Mapping[int, int] = field(default_factory=dict)
    """Layer -> the layer whose KV (storage and page table) it reads; not in vLLM's plan."""

    @classmethod
    def of(cls, config: KVCacheConfig, num_layers: int, heads_per_device: Callable[[int], int],
           shared: Mapping[int, int] | None = None) -> KVLayout:
        """Read vLLM's plan for a model of ``num_layers`` decoder layers; ``heads_per_device``
        maps a layer's KV head count to one device's share; ``shared`` maps each layer that
        reads another's KV to that layer."""
        shared = dict(shared or {})
        groups: list[KVGroup] = []
        specs: dict[int, tuple[int, AttentionSpec | MambaSpec]] = {}
        for g, group in enumerate(config.kv_cache_groups):
            indices = []
            for name in group.layer_names:
                layer = layer_index(name)
                specs[layer] = (g, _layer_spec(group.kv_cache_spec, name))
                indices.append(layer)
            indices += [layer for layer, target in shared.items() if target in indices]
            groups.append(_group(g, tuple(sorted(indices)), group.kv_cache_spec))
        planned = set(specs) | set(shared)
        missing = sorted(set(range(num_layers)) - planned)
        extra = sorted(planned - set(range(num_layers)))
        orphans = sorted(layer for layer, target in shared.items() if target not in specs or layer in specs)
        if missing or extra or orphans:
            raise TTUnsupportedFeatureError(
                "KV cache layers", sorted(specs), f"one KV cache layer per decoder layer 0..{num_layers - 1} "
                f"(missing {missing}, unknown {extra}; shared layers whose target vLLM did not plan or "
                f"that vLLM planned themselves: {orphans})",
                "return one spec per layer that owns its KV from get_kv_cache_spec()",
            )
        storage = _storage_of(config)
        layers = []
        for layer in range(num_layers):
            owner = shared.get(layer, layer)
            g, spec = specs[owner]
            shape, dtype = _layer_shape(config.num_blocks, spec, groups[g].block_size, heads_per_device)
            layers.append(LayerKV(g, shape, dtype, storage[owner]))
        return cls(tuple(groups), tuple(layers), shared)

    @property
    def text_group(self) -> KVGroup:
        """The group whose table is the contract's ``page_table``: the first over the text."""
        return next(group for group in self.groups if not group.cross)

    @property
    def attention_group(self) -> KVGroup:
        """The first full or latent attention group: the one a model-side drafter's pages
        follow (a hybrid model's first group may hold recurrent states or a window)."""
        return next(group for group in self.groups if group.kind in ("full", "mla"))

    @property
    def cross_group(self) -> KVGroup | None:
        return next((group for group in self.groups if group.cross), None)

    @property
    def uniform(self) -> bool:
        """Every layer has the same shape and dtype (tt-metal's legacy ``allocate_kv_cache``)."""
        return len({(layer.shape, layer.dtype) for layer in self.layers}) == 1

    def per_layer_specs(self) -> list[LayerKVSpec]:
        return [(layer.shape, layer.dtype, layer.tensor_idx) for layer in self.layers]

    def block_tokens(self) -> str:
        """Tokens per block of the token-holding groups: one size, or each size with the kinds
        that have it (vLLM grows the block size of smaller-page groups until every page holds
        as many bytes: Gemma 4's sliding groups next to its wider full ones)."""
        kinds: dict[int, list[str]] = {}
        for group in self.groups:
            if not group.recurrent:
                kinds.setdefault(group.block_size, []).append(group.kind)
        if len(kinds) == 1:
            return str(next(iter(kinds)))
        return ", ".join(f"{size} ({'/'.join(dict.fromkeys(names))})" for size, names in sorted(kinds.items()))

    def describe(self) -> str:
        reads = [f"layer {layer} reads layer {target}'s KV" for layer, target in sorted(self.shared.items())]
        return "; ".join([group.describe() for group in self.groups] + reads)


def _layer_spec(spec: KVCacheSpec, name: str) -> AttentionSpec | MambaSpec:
    if isinstance(spec, UniformTypeKVCacheSpecs):
        spec = spec.kv_cache_specs[name]
    if not isinstance(spec, (FullAttentionSpec, SlidingWindowSpec, MambaSpec, CrossAttentionSpec)):
        raise TTUnsupportedFeatureError(
            f"KV cache spec of {name}", type(spec).__name__,
            "FullAttentionSpec, SlidingWindowSpec, MLAAttentionSpec, MambaSpec or CrossAttentionSpec",
            "declare full, sliding-window, latent or cross attention or a recurrent state in get_kv_cache_spec()",
        )
    return spec


def _layer_shape(num_blocks: int, spec: AttentionSpec | MambaSpec, block_size: int,
                 heads_per_device: Callable[[int], int]) -> tuple[KVShape | StateShapes, KVDtype]:
    """What ``allocate_kv_cache_per_layer`` gets for one layer: its K/V shape and dtype, or a
    recurrent layer's state shapes and dtypes (the state is not split over devices here)."""
    if isinstance(spec, MambaSpec):
        return tuple((num_blocks, *shape) for shape in spec.shapes), tuple(spec.dtypes)
    return (num_blocks, heads_per_device(spec.num_kv_heads), block_size, spec.head_size), spec.dtype


def _group(index: int, layers: tuple[int, ...], spec: KVCacheSpec) -> KVGroup:
    if isinstance(spec, UniformTypeKVCacheSpecs):  # one kind, per-layer shapes: the kind is the group's
        spec = next(iter(spec.kv_cache_specs.values()))
    if isinstance(spec, SlidingWindowSpec):
        return KVGroup(index, layers, spec.block_size, spec.sliding_window,
                       spec.sliding_window - 1 + spec.extra_retained_tokens)
    if isinstance(spec, MLAAttentionSpec):
        return KVGroup(index, layers, spec.block_size, None, latent=True)
    if isinstance(spec, MambaSpec):
        return KVGroup(index, layers, spec.block_size, None, recurrent=True,
                       state_boundaries=spec.mamba_cache_mode == "align", state_slots=1 + spec.num_speculative_blocks)
    if isinstance(spec, CrossAttentionSpec):
        return KVGroup(index, layers, spec.block_size, None, cross=True)
    # A FullAttentionSpec with a sliding_window (vLLM's hybrid manager disabled) keeps every
    # block: to the runner it is a full group.
    return KVGroup(index, layers, spec.block_size, None)


def _storage_of(config: KVCacheConfig) -> dict[int, int]:
    """``tensor_idx`` per layer: vLLM places layer ``layers[l]`` of a ``KVCacheTensor`` at
    ``offset + l * layer_stride`` in one backing allocation, and layers placed at the same
    byte share storage. Storage slots are numbered by their first layer, in layer order."""
    start_of: dict[int, int] = {}
    for tensor in config.kv_cache_tensors:
        for position, name in enumerate(tensor.layers):
            start_of[layer_index(name)] = tensor.offset + position * tensor.layer_stride
    slots: dict[int, int] = {}
    return {layer: slots.setdefault(start_of[layer], len(slots)) for layer in sorted(start_of)}
