"""GPT-OSS: attention sinks, sliding and full layers, YaRN and top-k routed clamped-SwiGLU experts."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import SLIDING, HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTGptOssForCausalLM": "model:HostGptOssForCausalLM",
    },
    tiny=("gpt_oss",),
    capabilities={"TTGptOssForCausalLM": SLIDING},
)
