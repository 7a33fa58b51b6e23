"""Llama 3.2 Vision (Mllama): the Llama decoder with gated cross-attention layers over the
projected states of a tiled vision tower, kept in a cross-attention KV cache of their own."""

from __future__ import annotations

from typing import Any

from vllm_tt_host.models.frame.family import HostFamily
from vllm_tt_host.models.frame.shapes import PREFILL_BUCKETS

CAPABILITIES: dict[str, Any] = {
    "supports_device_penalties": False, "prefill_trace_lens": list(PREFILL_BUCKETS),
    "kv_cache_kinds": ["full_attention", "cross_attention"], "single_program_lanes": True,
}
"""tt-metal's Mllama flags (no prefix caching, no device sampling; no async decode here: the
decode call's cross page table is set before it runs), plus the cross-attention KV kind and
lanes (each lane's call brings its own rows' cross page table)."""

FAMILY = HostFamily(
    __name__,
    models={"TTMllamaForConditionalGeneration": "model:HostMllamaForConditionalGeneration"},
    tiny=("vllm_tt_testing.tiny_mllama",),
    capabilities={"TTMllamaForConditionalGeneration": CAPABILITIES},
)
