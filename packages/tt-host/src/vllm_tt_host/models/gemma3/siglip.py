"""The SigLIP vision tower (Gemma 3's image encoder) in host torch math.

An image becomes a grid of patches (one strided convolution), each patch gets a learned
position embedding, and pre-norm encoder layers attend over all patches at once: vision
attention is bidirectional, with no mask at all. A final LayerNorm ends the tower; the
attention-pooling head SigLIP has for contrastive training is not part of a VL model's path
and is refused if a config asks for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.config import model_name
from vllm_tt_host.models.frame.linear import Linear
from vllm_tt_host.models.frame.vision import VisionTowerConfig

VISION_ACTIVATIONS: tuple[str, ...] = ("gelu_pytorch_tanh", "gelu")


@dataclass(frozen=True)
class SiglipConfig(VisionTowerConfig):
    """The numbers of a ``siglip_vision_model`` config the tower needs."""

    layer_norm_eps: float

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @classmethod
    def from_hf(cls, hf_vision: Any) -> SiglipConfig:
        model = model_name(hf_vision)
        fields = cls.tower_fields(hf_vision, VISION_ACTIVATIONS)
        if getattr(hf_vision, "vision_use_head", False):
            raise TTUnsupportedFeatureError(
                f"{model}: vision_config.vision_use_head", True, "false",
                "a vision-language model reads the tower's patch states, not the pooling head",
            )
        hidden, heads, image, patch = (fields[k] for k in ("hidden_size", "num_heads", "image_size", "patch_size"))
        if hidden % heads or image % patch:
            raise TTUnsupportedFeatureError(
                f"{model}: vision_config", {"hidden_size": hidden, "num_attention_heads": heads,
                                            "image_size": image, "patch_size": patch},
                "hidden_size divisible by num_attention_heads, image_size by patch_size",
                "check the checkpoint's config.json",
            )
        return cls(**fields, layer_norm_eps=float(getattr(hf_vision, "layer_norm_eps", 1e-6)))


@dataclass(frozen=True)
class SiglipLayerWeights:
    norm1: Linear
    """LayerNorm weight and bias (a ``Linear`` pair only as storage)."""
    q: Linear
    k: Linear
    v: Linear
    out: Linear
    norm2: Linear
    fc1: Linear
    fc2: Linear


@dataclass(frozen=True)
class SiglipWeights:
    patch: Linear
    """The patch convolution: weight ``[hidden, channels, patch, patch]``."""
    positions: torch.Tensor
    """``[patches, hidden]``: one learned embedding per patch of the grid."""
    layers: tuple[SiglipLayerWeights, ...]
    post_norm: Linear


def load_siglip_weights(reader: WeightFolder, prefix: str, config: SiglipConfig) -> SiglipWeights:
    """The tower's tensors under ``prefix`` (transformers 5 writes ``vision_tower.``)."""

    def pair(name: str) -> Linear:
        return Linear(reader.tensor(f"{prefix}{name}.weight"), reader.tensor(f"{prefix}{name}.bias"))

    layers = tuple(
        SiglipLayerWeights(
            norm1=pair(f"{p}layer_norm1"), q=pair(f"{p}self_attn.q_proj"), k=pair(f"{p}self_attn.k_proj"),
            v=pair(f"{p}self_attn.v_proj"), out=pair(f"{p}self_attn.out_proj"), norm2=pair(f"{p}layer_norm2"),
            fc1=pair(f"{p}mlp.fc1"), fc2=pair(f"{p}mlp.fc2"),
        )
        for p in (f"encoder.layers.{i}." for i in range(config.num_layers))
    )
    weights = SiglipWeights(
        patch=pair("embeddings.patch_embedding"),
        positions=reader.tensor(f"{prefix}embeddings.position_embedding.weight"),
        layers=layers,
        post_norm=pair("post_layernorm"),
    )
    c = config
    expected = {
        "embeddings.patch_embedding.weight": (weights.patch.weight, (c.hidden_size, c.num_channels, c.patch_size, c.patch_size)),
        "embeddings.position_embedding.weight": (weights.positions, (c.patches_per_side**2, c.hidden_size)),
        "encoder.layers.0.mlp.fc1.weight": (layers[0].fc1.weight, (c.intermediate_size, c.hidden_size)),
    }
    check_shapes({prefix + name: pair for name, pair in expected.items()}, reader.folder, implied_by="the vision config")
    return weights


class SiglipVisionTower:
    def __init__(self, config: SiglipConfig, weights: SiglipWeights) -> None:
        self.config = config
        self.weights = weights

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``pixel_values [n, channels, size, size]`` (normalised floats) -> patch states
        ``[n, patches, hidden]``, patches in row-major grid order."""
        c, w = self.config, self.weights
        expected = (c.num_channels, c.image_size, c.image_size)
        if pixel_values.dim() != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)}; the vision tower takes "
                f"[images, {c.num_channels}, {c.image_size}, {c.image_size}]"
            )
        patches = F.conv2d(pixel_values.to(torch.float32), w.patch.weight, w.patch.bias, stride=c.patch_size)
        x = patches.flatten(2).transpose(1, 2) + w.positions
        for layer in w.layers:
            x = x + self._attention(self._layer_norm(x, layer.norm1), layer)
            h = self._layer_norm(x, layer.norm2)
            x = x + layer.fc2(self._activation(layer.fc1(h)))
        return self._layer_norm(x, w.post_norm)

    def _attention(self, h: torch.Tensor, layer: SiglipLayerWeights) -> torch.Tensor:
        """Full attention over all patches of each image (no mask)."""
        c = self.config
        n, tokens, _ = h.shape

        def heads(proj: Linear) -> torch.Tensor:
            return proj(h).view(n, tokens, c.num_heads, c.head_dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(layer.q), heads(layer.k), heads(layer.v), scale=c.head_dim**-0.5)
        return layer.out(out.transpose(1, 2).reshape(n, tokens, c.hidden_size))

    def _layer_norm(self, x: torch.Tensor, norm: Linear) -> torch.Tensor:
        return F.layer_norm(x, (self.config.hidden_size,), norm.weight, norm.bias, self.config.layer_norm_eps)

    def _activation(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh" if self.config.activation == "gelu_pytorch_tanh" else "none")
