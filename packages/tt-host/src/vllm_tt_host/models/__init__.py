"""Host reference models: real torch math behind the TT model contract, for the host mesh.

``frame`` holds what every family shares; each family is one subpackage whose ``__init__``
declares it (``HostFamily``). ``FAMILIES`` is the registry, one row per family, and
``HOST_MODELS`` and ``HOST_SOURCE`` are built from it. Importing this package stays cheap (no
torch): the model registry reads ``HOST_SOURCE`` (targets and stated capabilities) through the
``vllm_tt.model_sources`` entry point and imports a class only when it serves it.
"""

from __future__ import annotations

from typing import Any

from vllm_tt_host.models import (
    bert,
    deepseek_v3,
    gemma3,
    gemma4,
    gpt_oss,
    llama,
    mistral3,
    mllama,
    qwen2_5_vl,
    qwen3_5,
    qwen3_5_vl,
    qwen3_vl,
)
from vllm_tt_host.models.frame.family import HostFamily, host_models, host_source

FAMILIES: tuple[HostFamily, ...] = (
    llama.FAMILY,
    gemma3.FAMILY,
    gemma4.FAMILY,
    qwen2_5_vl.FAMILY,
    qwen3_vl.FAMILY,
    mistral3.FAMILY,
    mllama.FAMILY,
    gpt_oss.FAMILY,
    deepseek_v3.FAMILY,
    qwen3_5.FAMILY,
    qwen3_5_vl.FAMILY,
    bert.FAMILY,
)
"""The host families, in the order the registry and the docs list them."""

HOST_MODELS: dict[str, str] = host_models(FAMILIES)
"""TT architecture name -> ``"module:Class"`` of its host reference model."""

HOST_SOURCE: dict[str, dict[str, Any]] = host_source(FAMILIES)
"""The ``vllm_tt.model_sources`` entry point ``host``: each target with its stated capabilities."""

HOST_CAPABILITIES: dict[str, dict[str, Any]] = {arch: row["capabilities"] for arch, row in HOST_SOURCE.items()}
"""What each class declares in ``model_capabilities``, as its family states it."""

__all__ = ["FAMILIES", "HOST_CAPABILITIES", "HOST_MODELS", "HOST_SOURCE"]
