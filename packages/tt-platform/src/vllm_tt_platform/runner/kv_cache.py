"""``RunnerKV``: the runner's KV cache from spec to allocation.

Before vLLM plans the cache, it says what the model needs (the spec, one entry per layer, and
the block budget); once vLLM has planned it, it allocates through the model contract and keeps
the layout the step inputs need. A model class with ``get_kv_cache_spec(vllm_config)`` gives
its own spec (tt-metal's opt-in to hybrid KV: sliding-window layers, per-layer shapes) and gets
``page_tables_per_layer`` on every call; any other model is served as before, one full-attention
spec for every layer and one page table. A model whose later layers read an earlier layer's KV
(Gemma 4's ``num_kv_shared_layers``) also names them (``get_kv_sharing_targets``): like vLLM's
``kv_sharing_target_layer_name``, they get no spec of their own (vLLM plans and the budget
counts no blocks for them) and share their target's storage and page table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from vllm.config import VllmConfig
from vllm.logger import init_logger
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec

from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.mesh.topology import Topology
from vllm_tt_platform.runner.kv_budget import KVBudget
from vllm_tt_platform.runner.kv_layout import KVLayout, layer_index

logger = init_logger("vllm." + __name__)

DEFAULT_KV_TOKENS = 131_072
"""KV pool per lane when a model does not say (tt-metal's fallback)."""


class RunnerKV:
    def __init__(self, vllm_config: VllmConfig, topology: Topology) -> None:
        self.vllm_config = vllm_config
        self.topology = topology
        self.hf_config = vllm_config.model_config.hf_text_config
        self.user_blocks = vllm_config.cache_config.num_gpu_blocks_override
        """``--num-gpu-blocks-override`` as the user gave it (None: the budget decides)."""
        self.num_blocks: int | None = None
        """Blocks per lane, once vLLM has planned the cache (``allocate``)."""
        self.layout: KVLayout | None = None
        """Set by ``allocate``; kept only for a model that declared its spec (per-layer tables)."""
        self.planned: KVLayout | None = None
        """The layout vLLM planned, set by ``allocate`` for every model (KV transfers read it)."""

    @property
    def num_layers(self) -> int:
        return self.hf_config.num_hidden_layers

    @property
    def devices_per_lane(self) -> int:
        return self.topology.mesh.shape.split(self.topology.lanes).num_devices

    def heads_per_device(self, heads: int) -> int:
        """One device's share of ``heads`` KV heads (heads are split over a lane's devices)."""
        return heads // min(self.devices_per_lane, heads)

    @staticmethod
    def declares_spec(model_cls: type) -> bool:
        return callable(getattr(model_cls, "get_kv_cache_spec", None))

    def sharing(self, model_cls: type) -> dict[int, int]:
        """Layer -> the earlier layer whose KV it reads, from the model's
        ``get_kv_sharing_targets(vllm_config)`` (layer names, as vLLM's attention layers name
        their ``kv_sharing_target_layer_name``); empty when it declares none."""
        declared: Callable[[VllmConfig], dict[str, str]] | None = getattr(model_cls, "get_kv_sharing_targets", None)
        if not callable(declared):
            return {}
        targets = {layer_index(name): layer_index(target) for name, target in declared(self.vllm_config).items()}
        chained = sorted(layer for layer, target in targets.items() if target in targets or target >= layer)
        if chained:
            raise TTUnsupportedFeatureError(
                f"{model_cls.__qualname__}.get_kv_sharing_targets() layers", chained,
                "layers reading the KV of an earlier layer that owns its KV",
                "name a target that is not itself shared and comes before the layer",
            )
        return targets

    def spec(self, model_cls: type) -> dict[str, KVCacheSpec]:
        """The spec the worker gives vLLM: the model's own (without the layers that read
        another layer's KV), else full attention everywhere."""
        declared: Callable[[VllmConfig], dict[str, KVCacheSpec]] | None = getattr(model_cls, "get_kv_cache_spec", None)
        if callable(declared):
            spec = dict(declared(self.vllm_config))
            shared = self.sharing(model_cls)
            layers = sorted([layer_index(name) for name in spec] + list(shared))
            if layers != list(range(self.num_layers)):
                raise TTUnsupportedFeatureError(
                    f"{model_cls.__qualname__}.get_kv_cache_spec() layers", layers,
                    f"one entry per decoder layer 0..{self.num_layers - 1}, except the layers "
                    f"get_kv_sharing_targets() names ({sorted(shared)})",
                    "key the spec model.layers.{i}.self_attn for every layer that owns its KV",
                )
            return spec
        hf = self.hf_config
        full = FullAttentionSpec(
            block_size=self.vllm_config.cache_config.block_size,
            num_kv_heads=hf.num_key_value_heads,
            head_size=getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
            dtype=cast(torch.dtype, self.vllm_config.model_config.dtype),  # a torch dtype once built
        )
        return {f"model.layers.{i}.self_attn": full for i in range(self.num_layers)}

    def pool_tokens(self, model_cls: type) -> int:
        """KV tokens one lane's full-attention layers hold (the model's
        ``get_max_tokens_all_users``, else tt-metal's fallback)."""
        query = getattr(model_cls, "get_max_tokens_all_users", None)
        if query is None:
            return DEFAULT_KV_TOKENS
        return int(query(
            model_name=self.vllm_config.model_config.model,
            num_devices=self.devices_per_lane,
            tt_data_parallel=self.topology.lanes,
            max_model_len=self.vllm_config.model_config.max_model_len,
            max_num_seqs=self.topology.rows_per_lane,
        ))

    def budget(self, model_cls: type) -> KVBudget:
        return KVBudget.plan(self.vllm_config, self.spec(model_cls), self.pool_tokens(model_cls),
                             self.topology.rows_per_lane)

    def reserve(self, model_cls: type) -> int:
        """Fix vLLM's block count to the budget (``num_gpu_blocks_override``, read by vLLM's KV
        planning right after the worker answers) unless the user set it; returns the budget's
        bytes, which give the same count for a one-group layout."""
        budget = self.budget(model_cls)
        if self.user_blocks is None:
            self.vllm_config.cache_config.num_gpu_blocks_override = budget.blocks
        logger.info("TT KV budget per lane: %s%s", budget.describe(),
                    "" if self.user_blocks is None else f"; --num-gpu-blocks-override {self.user_blocks} wins")
        return budget.bytes

    def allocate(self, model: Any, model_cls: type, config: KVCacheConfig) -> Any:
        """Allocate through the contract: ``allocate_kv_cache_per_layer`` when the model has it,
        else the legacy ``allocate_kv_cache`` (every layer alike)."""
        layout = KVLayout.of(config, self.num_layers, self.heads_per_device, self.sharing(model_cls))
        self.num_blocks = config.num_blocks
        self.planned = layout
        declared = self.declares_spec(model_cls)
        self.layout = layout if declared else None
        logger.info(
            "TT KV cache: %d blocks/lane of %s tokens; groups: %s; %s", config.num_blocks,
            layout.block_tokens(), layout.describe(),
            "page_tables_per_layer on every call" if declared else "one page table",
        )
        per_layer = getattr(model, "allocate_kv_cache_per_layer", None)
        if per_layer is not None:
            return per_layer(layout.per_layer_specs())
        if not layout.uniform:
            raise TTUnsupportedFeatureError(
                "KV cache layer shapes", sorted({layer.shape for layer in layout.layers}),
                "one shape for every layer (the legacy allocate_kv_cache(shape, dtype, num_layers))",
                f"implement {type(model).__qualname__}.allocate_kv_cache_per_layer(per_layer_specs)",
            )
        shape, dtype, _ = layout.per_layer_specs()[0]
        return model.allocate_kv_cache(shape, dtype, self.num_layers)

    def table_width(self, max_model_len: int, num_blocks: int | None = None) -> int:
        """``Lmax``: block-table entries per row (fewer than the lane has blocks)."""
        width = math.ceil(max_model_len / self.vllm_config.cache_config.block_size)
        return width if num_blocks is None else min(width, num_blocks)
