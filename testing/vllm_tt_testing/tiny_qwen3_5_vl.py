"""A tiny Qwen 3.5 vision-language checkpoint built from nothing, as the Qwen-VL ones
(``tiny_qwen_vl``: the locally trained tokenizer with the Qwen image tokens, a locally
configured image processor with 4-pixel patches, merge 2, mean and std 0.5, brief training on
the corpus and the captioning task): a Qwen 3.5 text side (a gated full-attention layer, two
gated delta-net layers, then another full-attention one, rope on a quarter of each head with the
interleaved mRoPE split) and a Qwen3-VL-style tower without DeepStack, as the 3.5 checkpoints
have.

The layers are not the checkpoints' order (three delta-net layers before each attention one):
behind the delta-net layers the briefly trained model forgot the image (its answers did not
depend on it at 150 and 400 steps), while a first attention layer that reads the image tokens
directly learns to tell image kinds apart in 300 steps."""

from __future__ import annotations

from pathlib import Path

from vllm_tt_testing.tiny_qwen_vl import build_qwen_vl
from vllm_tt_testing.tiny_vl import KINDS, built

__all__ = ["build_tiny_qwen3_5_vl"]

STAMP = ".vllm-tt-tiny-qwen3_5-vl.json"
STEPS = 300
RECIPE = {"format": 2, "train_steps": STEPS, "kinds": KINDS}
TEXT = {
    "num_hidden_layers": 4, "head_dim": 32, "rms_norm_eps": 1e-6,
    "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1], "mrope_interleaved": True},
}
"""What the 3.5 text side sets beyond the shared Qwen-VL text sizes."""


def build_tiny_qwen3_5_vl(out: Path) -> Path:
    """Write the checkpoint into ``out`` (idempotent per recipe) and return it."""
    if built(out, STAMP, RECIPE):
        return out
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    return build_qwen_vl(
        out, STAMP, RECIPE, Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor, Qwen3VLVideoProcessor,
        text=TEXT,
        vision=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, temporal_patch_size=2,
                    spatial_merge_size=2, out_hidden_size=64, num_position_embeddings=16),
        pixel_norm={"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}, steps=STEPS,
    )
