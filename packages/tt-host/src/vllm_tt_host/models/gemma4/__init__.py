"""Gemma 4 text: the Gemma 3 layers with per-layer KV shapes, KV-shared layers, proportional rope,
per-layer input embeddings (the E-series) and routed experts (the MoE model), and the
vision-language models on it (the Gemma 4 vision tower; Unified: the encoder-free embedder)."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import SLIDING, HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTGemma4ForCausalLM": "model:HostGemma4ForCausalLM",
        "TTGemma4ForConditionalGeneration": "vl:HostGemma4ForConditionalGeneration",
        "TTGemma4UnifiedForConditionalGeneration": "unified:HostGemma4UnifiedForConditionalGeneration",
    },
    tiny=("gemma4", "gemma4_e", "gemma4_moe", "gemma4_pages", "vllm_tt_testing.tiny_gemma4_vl"),
    capabilities={"TTGemma4ForCausalLM": SLIDING,
                  "TTGemma4ForConditionalGeneration": {**SLIDING, "modalities": ["image", "video", "audio"]},
                  "TTGemma4UnifiedForConditionalGeneration": {**SLIDING, "supports_prefix_caching": False,
                                                              "modalities": ["image", "video", "audio"]}},
)
