"""``HybridKVCausalLM``: a host model whose layers differ in attention kind (full or sliding).

It opts into the runner's hybrid KV path (tt-metal's contract): ``get_kv_cache_spec`` tells
vLLM each layer's kind, so vLLM's hybrid KV cache manager keeps one block table per kind and
frees sliding-window blocks that fall out of the window; ``allocate_kv_cache_per_layer`` lets
layers that vLLM placed in one tensor share storage; prefill and decode then receive one page
table per layer (``page_tables_per_layer``), which the decoder reads layer by layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.models.frame.inputs import check_kv_shape
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.shapes import HostModelInputError

LayerKVSpec = tuple[tuple[int, int, int, int], Any, int]
"""``(shape, dtype, tensor_idx)`` of one layer, as the runner passes it."""


def layer_name(layer: int) -> str:
    """The attention module name vLLM's KV cache config uses for ``layer``."""
    return f"model.layers.{layer}.self_attn"


class HybridKVCausalLM(HostCausalLM):
    """A decoder whose ``DecoderConfig.layer_windows`` name a window on some layers."""

    model_capabilities: ClassVar[dict[str, Any]] = {
        **HostCausalLM.model_capabilities, "kv_cache_kinds": ["full_attention", "sliding_window"],
    }

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any]:
        """One vLLM KV spec per layer that writes KV, in layer order: ``SlidingWindowSpec``
        where the layer has a window, ``FullAttentionSpec`` elsewhere, each with the layer's
        own head size and KV heads."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        config = cls.decoder_config(vllm_config.model_config.hf_config)
        block_size = vllm_config.cache_config.block_size
        dtype = vllm_config.model_config.dtype
        specs: dict[str, Any] = {}
        for layer in range(config.num_layers):
            if config.kv_source(layer) != layer:  # reads another layer's KV: no blocks of its own
                continue
            window = config.window(layer)
            common = {
                "block_size": block_size,
                "num_kv_heads": config.kv_heads_of(layer),
                "head_size": config.head_dim_of(layer),
                "dtype": dtype,
            }
            specs[layer_name(layer)] = (
                FullAttentionSpec(**common) if window is None else SlidingWindowSpec(**common, sliding_window=window)
            )
        return specs

    @classmethod
    def get_kv_sharing_targets(cls, vllm_config: Any) -> dict[str, str]:
        """Each layer that reads an earlier layer's KV -> that layer (vLLM's
        ``kv_sharing_target_layer_name``); the runner gives it its target's storage and table."""
        config = cls.decoder_config(vllm_config.model_config.hf_config)
        return {layer_name(layer): layer_name(config.kv_source(layer))
                for layer in range(config.num_layers) if config.kv_source(layer) != layer}

    def allocate_kv_cache_per_layer(self, per_layer_specs: Sequence[LayerKVSpec]) -> list[LaneKV]:
        """``kv[lane][layer] = [K, V]`` (float32, all KV heads, as ``allocate_kv_cache``);
        layers with the same ``tensor_idx`` share storage: the same tensors where their shapes
        agree, else views of one buffer whose blocks hold as many values. vLLM's hybrid manager
        pools layers by equal page size: of different head sizes, or of different block sizes
        (the smaller-page layers' blocks hold more tokens), each layer reading its own."""
        cfg = self.config
        if len(per_layer_specs) != cfg.num_layers:
            raise HostModelInputError(
                f"allocate_kv_cache_per_layer got {len(per_layer_specs)} layer specs, the model has "
                f"{cfg.num_layers} layers"
            )
        pages: dict[int, tuple[int, int]] = {}
        """``tensor_idx`` -> (num_blocks, values per block) of its storage."""
        layer_shapes: list[tuple[int, tuple[int, int, int, int]]] = []
        for layer, (shape, _dtype, tensor_idx) in enumerate(per_layer_specs):
            num_blocks, block_size = check_kv_shape(tuple(shape), cfg.num_layers, cfg, layer)
            heads, head_dim = cfg.kv_heads_of(layer), cfg.head_dim_of(layer)
            page = (num_blocks, block_size * heads * head_dim)
            if pages.setdefault(int(tensor_idx), page) != page:
                raise HostModelInputError(
                    f"layer {layer} shares KV tensor {tensor_idx} but asks for shape {tuple(shape)}, "
                    f"unlike the other layers in it ((num_blocks, values per block) = {pages[int(tensor_idx)]})"
                )
            layer_shapes.append((int(tensor_idx), (num_blocks, heads, block_size, head_dim)))
        if len({num_blocks for num_blocks, _ in pages.values()}) != 1:
            raise HostModelInputError(f"every KV tensor needs the same num_blocks, got {sorted(pages.values())}")
        return [self._lane_cache(layer_shapes) for _ in range(self.lanes.count)]

    def _lane_cache(self, layer_shapes: list[tuple[int, tuple[int, int, int, int]]]) -> LaneKV:
        """One lane's layers: each storage slot allocated in the shape of its first layer, the
        other layers in it viewing that buffer in their own shape."""
        storage: dict[int, list[torch.Tensor]] = {}
        for idx, shape in layer_shapes:
            if idx not in storage:
                storage[idx] = self.layer_storage(shape)
        views: dict[tuple[int, tuple[int, int, int, int]], list[torch.Tensor]] = {}
        for idx, shape in layer_shapes:
            views.setdefault((idx, shape), [t if t.shape == shape else t.view(shape) for t in storage[idx]])
        return [list(views[idx, shape]) for idx, shape in layer_shapes]
