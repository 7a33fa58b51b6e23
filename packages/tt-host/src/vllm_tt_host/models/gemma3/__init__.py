"""Gemma 3: the text model (sliding and global layers, ``1 + w`` norms, GeGLU) and the
vision-language model on it (SigLIP tower, pooled projector)."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import MIXED, SLIDING, HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTGemma3ForCausalLM": "model:HostGemma3ForCausalLM",
        "TTGemma3ForConditionalGeneration": "vl:HostGemma3ForConditionalGeneration",
    },
    tiny=("gemma3", "vllm_tt_testing.tiny_gemma3_vl"),
    capabilities={"TTGemma3ForCausalLM": {**SLIDING, **MIXED}, "TTGemma3ForConditionalGeneration": SLIDING},
)
