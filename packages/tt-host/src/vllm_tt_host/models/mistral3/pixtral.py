"""The Pixtral vision tower (Mistral 3's image encoder) in host torch math.

Unlike SigLIP, Pixtral takes an image at its own size (any multiple of the patch size up to
``image_size``): one strided convolution makes its patch grid, an RMSNorm follows, and pre-norm
layers (RMSNorm, attention, RMSNorm, gated MLP) attend over the patches of that one image. The
patches carry no learned position embedding; attention rotates q and k by each patch's row and
column instead (2D rotary: half of the rotated pairs turn with the row, half with the column).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.config import model_name
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope import apply_rotary
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import VisionTowerConfig

VISION_ACTIVATIONS: tuple[str, ...] = ("silu", "gelu")
NORM_EPS = 1e-5
"""Pixtral's RMSNorms use a fixed epsilon (the config has none)."""


@dataclass(frozen=True)
class PixtralConfig(VisionTowerConfig):
    """The numbers of a ``pixtral`` vision config the tower needs."""

    rope_theta: float

    @classmethod
    def from_hf(cls, hf_vision: Any) -> PixtralConfig:
        model = model_name(hf_vision)
        fields = cls.tower_fields(hf_vision, VISION_ACTIVATIONS)
        hidden, heads = fields["hidden_size"], fields["num_heads"]
        if hidden % heads or (hidden // heads) % 4:
            raise TTConfigError(
                f"{model}: vision_config", {"hidden_size": hidden, "num_attention_heads": heads},
                "a head size (hidden_size / num_attention_heads) divisible by 4 (2D rotary)",
                "check the checkpoint's config.json",
            )
        rope = dict(getattr(hf_vision, "rope_parameters", None) or {})
        if rope.get("rope_type", "axial") != "axial":
            raise TTUnsupportedFeatureError(
                f"{model}: vision_config.rope_parameters.rope_type", rope.get("rope_type"), "axial",
                "serve this model with a ttnn mesh",
            )
        return cls(**fields, rope_theta=float(rope.get("rope_theta", getattr(hf_vision, "rope_theta", 10000.0))))


@dataclass(frozen=True)
class PixtralLayerWeights:
    attention_norm: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    ffn_norm: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor


@dataclass(frozen=True)
class PixtralWeights:
    patch: torch.Tensor
    """The patch convolution ``[hidden, channels, patch, patch]`` (no bias)."""
    pre_norm: torch.Tensor
    layers: tuple[PixtralLayerWeights, ...]


def load_pixtral_weights(reader: WeightFolder, prefix: str, config: PixtralConfig,
                         layers: int) -> PixtralWeights:
    """The first ``layers`` layers of the tower under ``prefix`` (the deepest feature layer)."""
    def get(name: str) -> torch.Tensor:
        return reader.tensor(prefix + name)

    stack = tuple(
        PixtralLayerWeights(
            attention_norm=get(f"{p}attention_norm.weight"), q=get(f"{p}attention.q_proj.weight"),
            k=get(f"{p}attention.k_proj.weight"), v=get(f"{p}attention.v_proj.weight"),
            o=get(f"{p}attention.o_proj.weight"), ffn_norm=get(f"{p}ffn_norm.weight"),
            gate=get(f"{p}feed_forward.gate_proj.weight"), up=get(f"{p}feed_forward.up_proj.weight"),
            down=get(f"{p}feed_forward.down_proj.weight"),
        )
        for p in (f"transformer.layers.{i}." for i in range(layers))
    )
    weights = PixtralWeights(patch=get("patch_conv.weight"), pre_norm=get("ln_pre.weight"), layers=stack)
    c = config
    expected: dict[str, tuple[torch.Tensor, tuple[int, ...]]] = {
        "patch_conv.weight": (weights.patch, (c.hidden_size, c.num_channels, c.patch_size, c.patch_size)),
    }
    if stack:
        expected["transformer.layers.0.feed_forward.up_proj.weight"] = (stack[0].up, (c.intermediate_size,
                                                                                      c.hidden_size))
    check_shapes({prefix + name: pair for name, pair in expected.items()}, reader.folder, implied_by="the vision config")
    return weights


class PixtralVisionTower:
    """Patch states of one image after layer ``feature_layer`` (0: the normed patch embeddings);
    only the layers up to it are loaded and run."""

    def __init__(self, config: PixtralConfig, weights: PixtralWeights, feature_layer: int) -> None:
        if len(weights.layers) < feature_layer:
            raise ValueError(f"feature_layer={feature_layer}, but {len(weights.layers)} tower layers are loaded")
        self.config = config
        self.weights = weights
        self.feature_layer = feature_layer
        exponents = torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim
        inv = 1.0 / (config.rope_theta**exponents)
        self.row_freq, self.col_freq = inv[0::2], inv[1::2]

    @torch.no_grad()
    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """``pixels [channels, h, w]`` (normalised floats, sides multiples of the patch size)
        -> ``[(h / patch) * (w / patch), hidden]``, patches row-major."""
        c, w = self.config, self.weights
        if pixels.dim() != 3 or pixels.shape[0] != c.num_channels or pixels.shape[1] % c.patch_size \
                or pixels.shape[2] % c.patch_size or max(pixels.shape[1:]) > c.image_size:
            raise HostModelInputError(
                f"an image's pixel_values have shape {tuple(pixels.shape)}; the Pixtral tower takes "
                f"[{c.num_channels}, h, w] with h and w multiples of {c.patch_size}, at most {c.image_size}"
            )
        grid = F.conv2d(pixels[None].to(torch.float32), w.patch, stride=c.patch_size)[0]
        rows, cols = grid.shape[1:]
        x = rms_norm(grid.flatten(1).T, w.pre_norm, NORM_EPS)
        r, q = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
        half = torch.cat((r.reshape(-1, 1) * self.row_freq, q.reshape(-1, 1) * self.col_freq), dim=-1)
        angles = torch.cat((half, half), dim=-1)[:, None, :]  # [patches, 1, head_dim]
        for layer in w.layers[: self.feature_layer]:
            x = x + self._attention(rms_norm(x, layer.attention_norm, NORM_EPS), layer, angles)
            h = rms_norm(x, layer.ffn_norm, NORM_EPS)
            x = x + F.linear(self._activation(F.linear(h, layer.gate)) * F.linear(h, layer.up), layer.down)
        return x

    def _attention(self, h: torch.Tensor, layer: PixtralLayerWeights, angles: torch.Tensor) -> torch.Tensor:
        """Full attention over the image's patches (no mask), q and k rotated by ``angles``."""
        c = self.config
        tokens = h.shape[0]

        def heads(weight: torch.Tensor, rotate: bool) -> torch.Tensor:
            x = F.linear(h, weight).view(tokens, c.num_heads, c.head_dim)
            if rotate:
                x = apply_rotary(x, angles.cos(), angles.sin())
            return x.transpose(0, 1)

        out = F.scaled_dot_product_attention(heads(layer.q, True), heads(layer.k, True), heads(layer.v, False),
                                             scale=c.head_dim**-0.5)
        return F.linear(out.transpose(0, 1).reshape(tokens, c.hidden_size), layer.o)

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x) if self.config.activation == "silu" else F.gelu(x)
