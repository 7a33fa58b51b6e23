"""A tiny Qwen3-VL checkpoint built from nothing, as the Qwen2.5-VL one (``tiny_qwen_vl``: the
locally trained tokenizer with the Qwen image tokens, a locally configured image processor
with 4-pixel patches, merge 2, mean and std 0.5 as Qwen3-VL's, brief training on the corpus and
the captioning task): a Qwen 3 text side with interleaved mRoPE and a Qwen3-VL tower whose
blocks 0 and 1 feed DeepStack into the first two decoder layers."""

from __future__ import annotations

from pathlib import Path

from vllm_tt_testing.tiny_qwen_vl import TRAIN_STEPS, build_qwen_vl
from vllm_tt_testing.tiny_vl import KINDS, built

__all__ = ["build_tiny_qwen3_vl"]

STAMP = ".vllm-tt-tiny-qwen3-vl.json"
RECIPE = {"format": 1, "train_steps": TRAIN_STEPS, "kinds": KINDS}


def build_tiny_qwen3_vl(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return build_qwen_vl(
        out, STAMP, RECIPE, Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor,
        text={"head_dim": 16, "num_hidden_layers": 3,
              "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                  "mrope_interleaved": True}},
        vision=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
                    spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16,
                    deepstack_visual_indexes=[0, 1]),
        pixel_norm={"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    )
