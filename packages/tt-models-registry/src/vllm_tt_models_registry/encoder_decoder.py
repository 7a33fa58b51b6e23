"""Checkpoints vLLM must treat as encoder-decoder models although their transformers config
does not say so.

vLLM reads ``hf_config.is_encoder_decoder`` when it builds ``ModelConfig`` and the scheduler
config (no chunked prefill, no prefix caching, the prompt split into encoder and decoder
prompts, a cross-attention KV group). transformers' ``MllamaConfig`` leaves it False: its own
model passes the vision states beside the text instead. The platform's config hook runs after
the scheduler config is built, so the marking is a config class registered by model type from
the ``vllm.general_plugins`` entry point, which vLLM loads before it reads any config.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

ENCODER_DECODER_CONFIGS: Mapping[str, str] = MappingProxyType({"mllama": "transformers:MllamaConfig"})
"""model_type -> the transformers config class marked as encoder-decoder."""

_marked: dict[str, type] = {}


def mark_encoder_decoder_configs() -> dict[str, type]:
    """Register, once per process, a subclass of each config of ``ENCODER_DECODER_CONFIGS``
    whose instances say ``is_encoder_decoder``; returns them by model type."""
    from transformers import AutoConfig

    for model_type, target in ENCODER_DECODER_CONFIGS.items():
        if model_type in _marked:
            continue
        module, name = target.split(":")
        base = getattr(importlib.import_module(module), name)

        def __init__(self: object, *args: object, __init: Any = base.__init__, **kwargs: object) -> None:
            __init(self, *args, **kwargs)
            self.is_encoder_decoder = True  # type: ignore[attr-defined]

        marked = type(f"EncoderDecoder{name}", (base,), {"__init__": __init__, "model_type": model_type,
                                                          "__doc__": f"{name}, marked encoder-decoder for vLLM."})
        AutoConfig.register(model_type, marked, exist_ok=True)
        _marked[model_type] = marked
    return dict(_marked)
