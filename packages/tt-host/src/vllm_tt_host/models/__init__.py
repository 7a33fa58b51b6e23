"""Host reference models: real torch math behind the TT model contract, for the host mesh.

``frame`` holds what every family shares; each family is one subpackage whose ``__init__``
declares it (``HostFamily``). ``FAMILIES`` is the registry, one row per family, and
``HOST_MODELS`` is built from it. Importing this package stays cheap (no torch): the model
registry reads ``HOST_MODELS`` through the ``vllm_tt.model_sources`` entry point and imports a
class only when it is used.
"""

from __future__ import annotations

from vllm_tt_host.models import bert, deepseek_v3, gemma3, gemma4, gpt_oss, llama, mistral3, qwen2_5_vl, qwen3_5
from vllm_tt_host.models.frame.family import HostFamily, host_models

FAMILIES: tuple[HostFamily, ...] = (
    llama.FAMILY,
    gemma3.FAMILY,
    gemma4.FAMILY,
    qwen2_5_vl.FAMILY,
    mistral3.FAMILY,
    gpt_oss.FAMILY,
    deepseek_v3.FAMILY,
    qwen3_5.FAMILY,
    bert.FAMILY,
)
"""The host families, in the order the registry and the docs list them."""

HOST_MODELS: dict[str, str] = host_models(FAMILIES)
"""TT architecture name -> ``"module:Class"`` of its host reference model."""

__all__ = ["FAMILIES", "HOST_MODELS"]
