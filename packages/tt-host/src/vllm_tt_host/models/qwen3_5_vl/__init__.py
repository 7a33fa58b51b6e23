"""Qwen 3.5 vision-language: the Qwen3-VL tower (no DeepStack) on the Qwen 3.5 hybrid decoder.

Text: the Qwen 3.5 layers (``qwen3_5``: gated delta-nets over a recurrent state, gated full
attention). Positions: Qwen3-VL's interleaved mRoPE on the rotated quarter of each head (an
image's placeholders take its grid coordinates, decode rotates at ``p + rope_delta``). Images:
Qwen3-VL's tower (learned position table, no DeepStack sets in the 3.5 checkpoints) gives each
image the vectors that replace its placeholder embeddings. Videos: Qwen3-VL's, one placeholder
run per temporal patch with the timestamp text between them, the tower over all the frames.
"""

from __future__ import annotations

from vllm_tt_host.models.frame.family import HostFamily, decoder_without

FAMILY = HostFamily(
    __name__,
    models={
        "TTQwen3_5ForConditionalGeneration": "model:HostQwen3_5ForConditionalGeneration",
    },
    tiny=("vllm_tt_testing.tiny_qwen3_5_vl",),
    capabilities={"TTQwen3_5ForConditionalGeneration": {
        **decoder_without("supports_async_decode", "single_program_lanes", "supports_verify_decode"),
        "kv_cache_kinds": ["full_attention", "recurrent_state"], "modalities": ["image", "video"],
        "chunked_mm_input": True,
    }},
)
