"""DeepSeek V3: multi-head latent attention over a latent KV cache, group-limited routed and
shared experts, YaRN."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import DECODER, HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTDeepseekV3ForCausalLM": "model:HostDeepseekV3ForCausalLM",
    },
    tiny=("deepseek_v3",),
    capabilities={"TTDeepseekV3ForCausalLM": {**DECODER, "kv_cache_kinds": ["mla"], "supports_mtp": True}},
)
