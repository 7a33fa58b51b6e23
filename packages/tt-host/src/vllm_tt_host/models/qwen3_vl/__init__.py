"""Qwen3-VL: the Qwen 3 decoder with interleaved mRoPE, its vision tower and DeepStack."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import HostFamily, decoder_without

FAMILY = HostFamily(
    __name__,
    models={
        "TTQwen3VLForConditionalGeneration": "model:HostQwen3VLForConditionalGeneration",
    },
    tiny=("vllm_tt_testing.tiny_qwen3_vl",),
    capabilities={"TTQwen3VLForConditionalGeneration": {
        **decoder_without("supports_async_decode", "supports_verify_decode"), "modalities": ["image", "video"]}},
)
"""Qwen3-VL (``Qwen3VLForConditionalGeneration``, the dense text side) on the host decoder, images
and videos.

Text: Qwen 3 layers (q and k RMS-normed per head). Positions: mRoPE as Qwen2.5-VL's
(``qwen2_5_vl``: an image's placeholders take its grid coordinates, decode rotates at
``p + rope_delta``), but the rotated pairs of a head take the temporal, height and width index
interleaved (t, h, w, t, h, w, ...; the first ``3 * mrope_section[1]`` pairs share height and
width, the rest turn with t) instead of in three contiguous groups.

Images: the tower (``qwen3_vl_vision``) gives each image its merged patch vectors, which
replace the embeddings of its placeholder tokens, and one DeepStack set per
``deepstack_visual_indexes`` block; set ``k`` is added to the hidden states of those same
positions after decoder layer ``k``. The contract carries nothing more for it: the model runs
its tower inside ``prefill_forward`` from ``pixel_values`` + ``image_grid_thw`` and hands the
sets to the layers in the row's ``PrefillInserts.layer_adds``; decode tokens are text.

Videos: ``pixel_values_videos`` + ``video_grid_thw``; the tower runs over all the frames
(attention within each temporal patch) and the video's features (and DeepStack sets) fill its
frame groups, one placeholder run per temporal patch with the timestamp text vLLM's processor
writes between them (``qwen2_5_vl.media``: each run placed as a one-frame image).
"""
