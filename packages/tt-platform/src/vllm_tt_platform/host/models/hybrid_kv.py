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

from vllm_tt_platform.host.models import paged_kv
from vllm_tt_platform.host.models.generator import HostCausalLM
from vllm_tt_platform.host.models.inputs import check_kv_shape
from vllm_tt_platform.host.models.paged_kv import LaneKV
from vllm_tt_platform.host.models.shapes import HostModelInputError

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
        """One vLLM KV spec per layer, in layer order: ``SlidingWindowSpec`` where the layer has
        a window, ``FullAttentionSpec`` elsewhere."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        config = cls.decoder_config(vllm_config.model_config.hf_config)
        block_size = vllm_config.cache_config.block_size
        dtype = vllm_config.model_config.dtype
        specs: dict[str, Any] = {}
        for layer in range(config.num_layers):
            window = config.window(layer)
            common = {
                "block_size": block_size,
                "num_kv_heads": config.num_kv_heads,
                "head_size": config.head_dim,
                "dtype": dtype,
            }
            specs[layer_name(layer)] = (
                FullAttentionSpec(**common) if window is None else SlidingWindowSpec(**common, sliding_window=window)
            )
        return specs

    def allocate_kv_cache_per_layer(self, per_layer_specs: Sequence[LayerKVSpec]) -> list[LaneKV]:
        """``kv[lane][layer] = [K, V]`` (float32, all KV heads, as ``allocate_kv_cache``);
        layers with the same ``tensor_idx`` get the same tensors."""
        cfg = self.config
        if len(per_layer_specs) != cfg.num_layers:
            raise HostModelInputError(
                f"allocate_kv_cache_per_layer got {len(per_layer_specs)} layer specs, the model has "
                f"{cfg.num_layers} layers"
            )
        shapes: dict[int, tuple[int, int, int, int]] = {}
        tensor_of_layer: list[int] = []
        block_sizes = set()
        for layer, (shape, _dtype, tensor_idx) in enumerate(per_layer_specs):
            num_blocks, block_size = check_kv_shape(tuple(shape), cfg.num_layers, cfg)
            full = (num_blocks, cfg.num_kv_heads, block_size, cfg.head_dim)
            if shapes.setdefault(int(tensor_idx), full) != full:
                raise HostModelInputError(
                    f"layer {layer} shares KV tensor {tensor_idx} but asks for shape {tuple(shape)}, "
                    f"unlike the other layers in it ({shapes[int(tensor_idx)]})"
                )
            block_sizes.add(block_size)
            tensor_of_layer.append(int(tensor_idx))
        if len(block_sizes) != 1:
            raise HostModelInputError(f"every layer needs the same block_size, got {sorted(block_sizes)}")
        return [self._lane_cache(shapes, tensor_of_layer) for _ in range(self.lanes.count)]

    @staticmethod
    def _layer_storage(shape: tuple[int, int, int, int]) -> list[torch.Tensor]:
        """One storage slot's ``[K, V]`` (a latent-attention model holds one tensor as both)."""
        return paged_kv.allocate(1, 1, shape)[0][0]

    def _lane_cache(self, shapes: dict[int, tuple[int, int, int, int]], tensor_of_layer: list[int]) -> LaneKV:
        tensors = {idx: self._layer_storage(shape) for idx, shape in shapes.items()}
        return [list(tensors[idx]) for idx in tensor_of_layer]
