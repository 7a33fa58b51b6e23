"""Qwen 3.5 text: gated delta-net layers over a recurrent state, interleaved with gated
full-attention layers."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import HostFamily, decoder_without

FAMILY = HostFamily(
    __name__,
    models={
        "TTQwen3_5ForCausalLM": "model:HostQwen3_5ForCausalLM",
    },
    tiny=("qwen3_5",),
    capabilities={"TTQwen3_5ForCausalLM": {
        **decoder_without("single_program_lanes"),
        "kv_cache_kinds": ["full_attention", "recurrent_state"],
        "supports_mtp": True,
    }},
)
