"""vLLM's own KV cache planning, as the engine core runs it for one worker: the
``KVCacheConfig`` a runner's ``initialize_kv_cache`` receives, without starting an engine."""

from __future__ import annotations

import importlib
import importlib.util
import types
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

TT_KV_CACHE_LAYOUTS = ["LBHNC"]
"""What ``TTWorker.get_supported_kv_cache_layouts`` reports."""


def spec_view(hf_config: Any, dtype: Any, block_size: int, max_model_len: int | None = None,
              mamba_cache_mode: str = "none") -> Any:
    """What a host model's ``get_kv_cache_spec`` reads of the ``VllmConfig`` (the checkpoint's
    transformers config, the dtype, the block size, when given the context length, and vLLM's
    recurrent-state cache mode: ``align`` with prefix caching, its state blocks as large as
    the attention blocks), without building one."""
    model_config = types.SimpleNamespace(hf_config=hf_config, dtype=dtype)
    if max_model_len is not None:
        model_config.max_model_len = max_model_len
    cache_config = types.SimpleNamespace(block_size=block_size, mamba_cache_mode=mamba_cache_mode,
                                         mamba_block_size=block_size)
    return types.SimpleNamespace(model_config=model_config, cache_config=cache_config)


def plan_kv_cache(vllm_config: VllmConfig, spec: dict[str, KVCacheSpec], num_blocks: int) -> KVCacheConfig:
    """vLLM's plan of ``spec`` over exactly ``num_blocks`` blocks per worker (through
    ``num_gpu_blocks_override``, which is restored afterwards)."""
    cache_config = vllm_config.cache_config
    override = cache_config.num_gpu_blocks_override
    cache_config.num_gpu_blocks_override = num_blocks
    available = num_blocks * sum(s.page_size_bytes for s in spec.values())
    try:
        # The engine core's order: the layout first (every supported vLLM), then the plan.
        from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

        resolve_kv_cache_layout(vllm_config, [TT_KV_CACHE_LAYOUTS], list(spec.values()))
        if importlib.util.find_spec("vllm.v1.core.kv_cache_planning") is not None:  # vLLM 0.33+
            from vllm.v1.core import kv_cache_planning as planning

            groups = planning.get_global_kv_cache_groups(vllm_config, [spec])
            return planning.get_kv_cache_configs(vllm_config, [spec], [available], groups)[0]
        legacy: Any = importlib.import_module("vllm.v1.core.kv_cache_utils")  # vLLM 0.31 / 0.32
        return legacy.get_kv_cache_configs(vllm_config, [spec], [available])[0]
    finally:
        cache_config.num_gpu_blocks_override = override
