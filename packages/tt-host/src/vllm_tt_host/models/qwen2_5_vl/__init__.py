"""Qwen2.5-VL: the Qwen 2 decoder with multimodal rotary positions and its windowed vision tower."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import HostFamily, decoder_without

FAMILY = HostFamily(
    __name__,
    models={
        "TTQwen2_5_VLForConditionalGeneration": "model:HostQwen2_5_VLForConditionalGeneration",
    },
    tiny=("vllm_tt_testing.tiny_qwen_vl",),
    capabilities={"TTQwen2_5_VLForConditionalGeneration": {
        **decoder_without("supports_async_decode", "supports_verify_decode"), "modalities": ["image", "video"]}},
)
