"""Host reference models: real torch math behind the TT model contract, for the host mesh.

Importing this package stays cheap (no torch): the model registry reads ``HOST_MODELS``
through the ``vllm_tt.model_sources`` entry point and imports a class only when it is used.
"""

from __future__ import annotations

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
    "TTBertModel": "vllm_tt_host.models.bert.model:HostBertModel",
    "TTBertForSequenceClassification": "vllm_tt_host.models.bert.model:HostBertForSequenceClassification",
}
"""TT architecture name -> ``"module:Class"`` of its host reference model."""

__all__ = ["HOST_MODELS"]
