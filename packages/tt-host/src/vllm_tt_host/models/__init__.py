"""Host reference models: real torch math behind the TT model contract, for the host mesh.

Importing this package stays cheap (no torch): the model registry reads ``HOST_SOURCE``
through the ``vllm_tt.model_sources`` entry point and imports a class only when it is used.
"""

from __future__ import annotations

from typing import Any

_FAMILIES = "vllm_tt_host.models.families"

HOST_MODELS: dict[str, str] = {
    "TTLlamaForCausalLM": f"{_FAMILIES}:HostLlamaForCausalLM",
    "TTMistralForCausalLM": f"{_FAMILIES}:HostMistralForCausalLM",
    "TTQwen2ForCausalLM": f"{_FAMILIES}:HostQwen2ForCausalLM",
    "TTQwen3ForCausalLM": f"{_FAMILIES}:HostQwen3ForCausalLM",
    "TTGemma3ForCausalLM": "vllm_tt_host.models.gemma3:HostGemma3ForCausalLM",
    "TTGemma4ForCausalLM": "vllm_tt_host.models.gemma4:HostGemma4ForCausalLM",
    "TTGemma3ForConditionalGeneration": "vllm_tt_host.models.gemma3_vl:HostGemma3ForConditionalGeneration",
    "TTQwen2_5_VLForConditionalGeneration": (
        "vllm_tt_host.models.qwen2_5_vl:HostQwen2_5_VLForConditionalGeneration"
    ),
    "TTMistral3ForConditionalGeneration": "vllm_tt_host.models.mistral3:HostMistral3ForConditionalGeneration",
    "TTGptOssForCausalLM": "vllm_tt_host.models.gpt_oss:HostGptOssForCausalLM",
    "TTDeepseekV3ForCausalLM": "vllm_tt_host.models.deepseek_v3:HostDeepseekV3ForCausalLM",
    "TTQwen3_5ForCausalLM": "vllm_tt_host.models.qwen3_5:HostQwen3_5ForCausalLM",
}
"""TT architecture name -> ``"module:Class"`` of its host reference model."""

_DECODER: dict[str, Any] = {
    "supports_sample_on_device": True, "supports_async_decode": True, "supports_prefix_caching": True,
    "single_program_lanes": True, "supports_prompt_logprobs": True, "supports_verify_decode": True,
    "prefill_trace_lens": [128, 1024, 2048, 4096],
}
_SLIDING = {**_DECODER, "kv_cache_kinds": ["full_attention", "sliding_window"]}


def _decoder_without(*flags: str) -> dict[str, Any]:
    return {k: v for k, v in _DECODER.items() if k not in flags}


HOST_CAPABILITIES: dict[str, dict[str, Any]] = {
    "TTLlamaForCausalLM": _DECODER,
    "TTMistralForCausalLM": _DECODER,
    "TTQwen2ForCausalLM": _DECODER,
    "TTQwen3ForCausalLM": _DECODER,
    "TTGemma3ForCausalLM": _SLIDING,
    "TTGemma4ForCausalLM": _SLIDING,
    "TTGemma3ForConditionalGeneration": _SLIDING,
    "TTQwen2_5_VLForConditionalGeneration": _decoder_without("supports_async_decode", "supports_verify_decode"),
    "TTMistral3ForConditionalGeneration": _DECODER,
    "TTGptOssForCausalLM": _SLIDING,
    "TTDeepseekV3ForCausalLM": {**_DECODER, "kv_cache_kinds": ["mla"]},
    "TTQwen3_5ForCausalLM": {
        **_decoder_without("supports_prefix_caching", "single_program_lanes", "supports_verify_decode"),
        "kv_cache_kinds": ["full_attention", "recurrent_state"],
    },
}
"""What each class declares in ``model_capabilities`` (the non-default flags), stated here so
that ``vllm-tt-models list --backend host`` imports no torch; tests/test_host_source.py fails
when a class and this table disagree."""

HOST_SOURCE: dict[str, dict[str, Any]] = {
    arch: {"target": target, "capabilities": HOST_CAPABILITIES[arch]} for arch, target in HOST_MODELS.items()
}
"""The ``vllm_tt.model_sources`` entry point ``host``: each target with its stated capabilities."""

__all__ = ["HOST_CAPABILITIES", "HOST_MODELS", "HOST_SOURCE"]
