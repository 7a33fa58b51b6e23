"""The encoder-free image embedder of Gemma 4 Unified, in host torch math.

Gemma 4 Unified has no vision tower: its image processor merges each ``k x k`` square of patches
into one "model patch" (``pixel_values [patches, 3 * (P * k)**2]`` in ``[0, 1]``, with
``pixel_position_ids`` of the merged grid, ``(-1, -1)`` padding to the budget), and every real
model patch becomes one image token on its own: LayerNorm, a dense projection, LayerNorm, plus a
learned embedding of its column and of its row, LayerNorm, then an RMSNorm without a weight and
the projection to the text width. No patch sees another.

Audio is encoder-free too: the feature extractor cuts the waveform into frames of
``audio_embed_dim`` raw samples, one audio token each, and every frame is RMS-normalised
without a weight and projected to the text width (``embed_audio``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.config import model_name, positive_int
from vllm_tt_host.models.frame.linear import Linear
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.shapes import HostModelInputError

LAYER_NORM_EPS = 1e-5
"""transformers builds the embedder's LayerNorms with torch's default eps."""


@dataclass(frozen=True)
class UnifiedVisionConfig:
    """The numbers of a ``gemma4_unified_vision`` config the embedder needs."""

    model_patch_size: int
    """Pixels per side of one merged patch (``patch_size * pooling_kernel_size``)."""
    embed_dim: int
    """``mm_embed_dim``"""
    positions: int
    """``mm_posemb_size``: rows of the position table (per axis)."""
    rms_norm_eps: float

    @property
    def patch_width(self) -> int:
        return 3 * self.model_patch_size**2

    @classmethod
    def from_hf(cls, hf_vision: Any) -> UnifiedVisionConfig:
        model = model_name(hf_vision)
        embed, out = (positive_int(hf_vision, f, model) for f in ("mm_embed_dim", "output_proj_dims"))
        if embed != out:
            raise TTConfigError(f"{model}: vision_config.output_proj_dims", out, f"mm_embed_dim={embed}",
                                "check the checkpoint's config.json")
        return cls(
            model_patch_size=positive_int(hf_vision, "patch_size", model) * positive_int(
                hf_vision, "pooling_kernel_size", model),
            embed_dim=embed, positions=positive_int(hf_vision, "mm_posemb_size", model),
            rms_norm_eps=float(getattr(hf_vision, "rms_norm_eps", 1e-6)),
        )


@dataclass(frozen=True)
class EmbedderWeights:
    patch_norm: Linear
    """LayerNorm of the raw merged patch (weight and bias)..."""
    dense: Linear
    dense_norm: Linear
    positions: torch.Tensor
    """``[mm_posemb_size, 2, embed]``: per position, its column and its row embedding."""
    position_norm: Linear
    projection: torch.Tensor
    """``[text hidden, embed]``"""


PATCH_PREFIXES: tuple[str, ...] = ("model.vision_embedder.", "vision_embedder.", "model.embed_vision.", "embed_vision.")
"""Where checkpoints keep the patch projection (transformers 5 writes the first)..."""
PROJECTION_NAMES: tuple[str, ...] = (
    "model.embed_vision.embedding_projection.weight", "embed_vision.embedding_projection.weight",
    "model.embed_vision.multimodal_embedder.embedding_projection.weight",
    "embed_vision.multimodal_embedder.embedding_projection.weight",
)
"""...and the projection to the text width (transformers 5 writes the first; its modules nest it
under the embedder)."""


def load_embedder_weights(reader: WeightFolder, config: UnifiedVisionConfig) -> EmbedderWeights:
    prefix = reader.prefix(PATCH_PREFIXES, "patch_dense.weight", "image embedder")
    projection = next((name for name in PROJECTION_NAMES if name in reader), PROJECTION_NAMES[0])

    def pair(name: str) -> Linear:
        return Linear(reader.tensor(f"{prefix}{name}.weight"), reader.tensor(f"{prefix}{name}.bias"))

    weights = EmbedderWeights(
        patch_norm=pair("patch_ln1"), dense=pair("patch_dense"), dense_norm=pair("patch_ln2"),
        positions=reader.tensor(f"{prefix}pos_embedding"), position_norm=pair("pos_norm"),
        projection=reader.tensor(projection),
    )
    c = config
    check_shapes({
        f"{prefix}patch_dense.weight": (weights.dense.weight, (c.embed_dim, c.patch_width)),
        f"{prefix}pos_embedding": (weights.positions, (c.positions, 2, c.embed_dim)),
    }, reader.folder, implied_by="the vision config")
    return weights


class Gemma4UnifiedEmbedder:
    """One image's merged patches -> its image token vectors in the text width."""

    def __init__(self, config: UnifiedVisionConfig, weights: EmbedderWeights) -> None:
        self.config = config
        self.weights = weights

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``pixel_values [patches, 3 * (P * k)**2]`` and ``positions [patches, 2]`` (padding at
        ``(-1, -1)``) -> ``[real patches, text hidden]``, in the processor's patch order."""
        c, w = self.config, self.weights
        real = (positions != -1).all(dim=-1)
        xy = positions[real].long()
        if xy.shape[0] == 0 or int(xy.max()) >= c.positions:
            raise HostModelInputError(
                f"an image's pixel_position_ids hold no real patch or reach past mm_posemb_size={c.positions}: "
                "send the Gemma 4 Unified image processor's positions"
            )
        x = w.patch_norm.layer_norm(pixel_values[real].to(torch.float32), LAYER_NORM_EPS)
        x = w.dense_norm.layer_norm(w.dense(x), LAYER_NORM_EPS)
        x = w.position_norm.layer_norm(x + w.positions[xy[:, 0], 0] + w.positions[xy[:, 1], 1], LAYER_NORM_EPS)
        return F.linear(rms_norm(x, torch.ones(()), c.rms_norm_eps), w.projection)


@dataclass(frozen=True)
class UnifiedAudioConfig:
    """A ``gemma4_unified_audio`` config: samples per frame (one audio token each) and the norm's eps."""

    embed_dim: int
    """``audio_embed_dim``"""
    rms_norm_eps: float

    @classmethod
    def from_hf(cls, hf_audio: Any) -> UnifiedAudioConfig:
        return cls(positive_int(hf_audio, "audio_embed_dim", model_name(hf_audio)),
                   float(getattr(hf_audio, "rms_norm_eps", 1e-6)))


class Gemma4UnifiedAudioEmbedder:
    """One clip's raw-sample frames -> its audio token vectors in the text width."""

    def __init__(self, config: UnifiedAudioConfig, projection: torch.Tensor) -> None:
        self.config = config
        self.projection = projection
        """``[text hidden, audio_embed_dim]``"""

    def tokens(self, frames: int) -> int:
        """Audio tokens of a clip of ``frames`` real frames: one each."""
        return frames

    @torch.no_grad()
    def __call__(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``features [frames, audio_embed_dim]`` and ``mask [frames]`` -> ``[real frames, text hidden]``."""
        if features.dim() != 2 or features.shape[1] != self.config.embed_dim or mask.shape != features.shape[:1]:
            raise HostModelInputError(
                f"audio input_features {tuple(features.shape)} with mask {tuple(mask.shape)}; expected "
                f"[frames, {self.config.embed_dim}] (raw samples per frame) and [frames]")
        real = features[mask.bool()].to(torch.float32)
        return F.linear(rms_norm(real, torch.ones(()), self.config.rms_norm_eps), self.projection)
