"""The Gemma 4 vision tower and its embedder into the text width, in host torch math.

The image processor hands each image over already cut into patches: ``pixel_values
[patches, 3 * P * P]`` in ``[0, 1]`` with ``pixel_position_ids [patches, 2]`` (each patch's
``(x, y)`` in the grid; ``(-1, -1)`` pads the image to the processor's patch budget). The tower
maps pixels to ``[-1, 1]``, projects each patch and adds a learned embedding per column and per
row; its layers are Gemma-style (RMSNorm before and after attention and the GeGLU MLP, q/k
RMSNorm with a weight, v without, attention unscaled) with a 2D rotary: the first half of each
head turns with the patch's column, the second with its row. Attention is bidirectional over
the image's real patches (padding takes no part, so it is dropped before the layers). Every
``k x k`` square of patches (``pooling_kernel_size``) is then averaged into one image token,
row-major, scaled by ``sqrt(hidden)``, optionally standardised (``(x - std_bias) * std_scale``),
RMS-normalised without a weight and projected to the text width (``embed_vision``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import WeightFolder, check_shapes
from vllm_tt_host.models.frame.config import model_name, positive_int
from vllm_tt_host.models.frame.mlp import gelu_tanh
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope import RotaryEmbedding, inverse_frequencies
from vllm_tt_host.models.frame.rope_config import RopeConfig
from vllm_tt_host.models.frame.shapes import HostModelInputError

VISION_ACTIVATIONS: tuple[str, ...] = ("gelu_pytorch_tanh",)
CLIP_BOUNDS: tuple[str, ...] = ("input_min", "input_max", "output_min", "output_max")
"""The buffers of a clipped projection (``use_clipped_linears``), in ``Projection.bounds`` order."""


@dataclass(frozen=True)
class Gemma4VisionConfig:
    """The numbers of a ``gemma4_vision`` config the tower needs."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    patch_size: int
    pooling: int
    """``pooling_kernel_size``: patches per side of one image token."""
    positions: int
    """``position_embedding_size``: rows of each axis' position table."""
    rms_norm_eps: float
    rope_theta: float
    clipped: bool
    """``use_clipped_linears``: every projection clamps its input and output to stored bounds."""
    standardize: bool

    @property
    def patch_width(self) -> int:
        return 3 * self.patch_size**2

    @classmethod
    def from_hf(cls, hf_vision: Any) -> Gemma4VisionConfig:
        model = model_name(hf_vision)
        act = getattr(hf_vision, "hidden_activation", None)
        if act not in VISION_ACTIVATIONS:
            raise TTUnsupportedFeatureError(f"{model}: vision_config.hidden_activation", act,
                                            ", ".join(VISION_ACTIVATIONS), "serve this model with a ttnn mesh")
        rope = dict(getattr(hf_vision, "rope_parameters", None) or {})
        if rope.get("rope_type", "axial") != "axial":
            raise TTUnsupportedFeatureError(f"{model}: vision_config.rope_parameters.rope_type", rope["rope_type"],
                                            "axial", "serve this model with a ttnn mesh")
        heads, kv_heads = (positive_int(hf_vision, f, model) for f in ("num_attention_heads", "num_key_value_heads"))
        head_dim = positive_int(hf_vision, "head_dim", model)
        if heads % kv_heads or head_dim % 4:
            raise TTConfigError(f"{model}: vision_config", {"num_attention_heads": heads,
                                                            "num_key_value_heads": kv_heads, "head_dim": head_dim},
                                "KV heads dividing the heads, a head_dim divisible by 4 (two rotary halves)",
                                "check the checkpoint's config.json")
        return cls(
            hidden_size=positive_int(hf_vision, "hidden_size", model),
            intermediate_size=positive_int(hf_vision, "intermediate_size", model),
            num_layers=positive_int(hf_vision, "num_hidden_layers", model), num_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim, patch_size=positive_int(hf_vision, "patch_size", model),
            pooling=positive_int(hf_vision, "pooling_kernel_size", model),
            positions=positive_int(hf_vision, "position_embedding_size", model),
            rms_norm_eps=float(getattr(hf_vision, "rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", 100.0)),
            clipped=bool(getattr(hf_vision, "use_clipped_linears", False)),
            standardize=bool(getattr(hf_vision, "standardize", False)),
        )


@dataclass(frozen=True)
class Projection:
    """A bias-free projection, clamped before and after when the tower clips its linears."""

    weight: torch.Tensor
    bounds: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    """``(input_min, input_max, output_min, output_max)``."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.bounds is None:
            return F.linear(x, self.weight)
        in_min, in_max, out_min, out_max = self.bounds
        return torch.clamp(F.linear(torch.clamp(x, in_min, in_max), self.weight), out_min, out_max)


@dataclass(frozen=True)
class VisionLayerWeights:
    q: Projection
    k: Projection
    v: Projection
    o: Projection
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    gate: Projection
    up: Projection
    down: Projection
    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    pre_feedforward_norm: torch.Tensor
    post_feedforward_norm: torch.Tensor


@dataclass(frozen=True)
class VisionWeights:
    patch: torch.Tensor
    """``[hidden, 3 * P * P]``: the patch projection."""
    positions: torch.Tensor
    """``[2, position_embedding_size, hidden]``: column, then row embeddings."""
    layers: tuple[VisionLayerWeights, ...]
    std_bias: torch.Tensor | None
    std_scale: torch.Tensor | None
    embedding: torch.Tensor
    """``[text hidden, hidden]``: ``embed_vision``'s projection to the text width."""


def load_vision_weights(reader: WeightFolder, tower: str, embedder: str, config: Gemma4VisionConfig) -> VisionWeights:
    """The tower's tensors under ``tower`` and the embedder's under ``embedder``."""
    get = reader.tensor

    def projection(name: str) -> Projection:
        if not config.clipped:
            return Projection(get(f"{name}.linear.weight"))
        low_in, high_in, low_out, high_out = (get(f"{name}.{b}") for b in CLIP_BOUNDS)
        return Projection(get(f"{name}.linear.weight"), (low_in, high_in, low_out, high_out))

    layers = tuple(
        VisionLayerWeights(
            q=projection(f"{p}self_attn.q_proj"), k=projection(f"{p}self_attn.k_proj"),
            v=projection(f"{p}self_attn.v_proj"), o=projection(f"{p}self_attn.o_proj"),
            q_norm=get(f"{p}self_attn.q_norm.weight"), k_norm=get(f"{p}self_attn.k_norm.weight"),
            gate=projection(f"{p}mlp.gate_proj"), up=projection(f"{p}mlp.up_proj"), down=projection(f"{p}mlp.down_proj"),
            input_norm=get(f"{p}input_layernorm.weight"), post_attention_norm=get(f"{p}post_attention_layernorm.weight"),
            pre_feedforward_norm=get(f"{p}pre_feedforward_layernorm.weight"),
            post_feedforward_norm=get(f"{p}post_feedforward_layernorm.weight"),
        )
        for p in (f"{tower}encoder.layers.{i}." for i in range(config.num_layers))
    )
    weights = VisionWeights(
        patch=get(f"{tower}patch_embedder.input_proj.weight"),
        positions=get(f"{tower}patch_embedder.position_embedding_table"),
        layers=layers,
        std_bias=get(f"{tower}std_bias") if config.standardize else None,
        std_scale=get(f"{tower}std_scale") if config.standardize else None,
        embedding=get(f"{embedder}embedding_projection.weight"),
    )
    c = config
    check_shapes({
        f"{tower}patch_embedder.input_proj.weight": (weights.patch, (c.hidden_size, c.patch_width)),
        f"{tower}patch_embedder.position_embedding_table": (weights.positions, (2, c.positions, c.hidden_size)),
        f"{tower}encoder.layers.0.mlp.gate_proj.linear.weight": (layers[0].gate.weight,
                                                                 (c.intermediate_size, c.hidden_size)),
    }, reader.folder, implied_by="the vision config")
    return weights


class Gemma4VisionTower:
    """One image's patches -> its image token vectors in the text width."""

    def __init__(self, config: Gemma4VisionConfig, weights: VisionWeights) -> None:
        self.config = config
        self.weights = weights
        half = config.head_dim // 2
        self.rotary = RotaryEmbedding(inverse_frequencies(RopeConfig(theta=config.rope_theta), half))

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """``pixel_values [patches, 3 * P * P]`` and ``positions [patches, 2]`` (padding at
        ``(-1, -1)``) -> ``[tokens, text hidden]``, the pooled grid in row-major order."""
        c, w = self.config, self.weights
        real = (positions != -1).all(dim=-1)
        pixels, xy = pixel_values[real].to(torch.float32), positions[real].long()
        grid = self._pooled_grid(xy)
        x = F.linear(2 * (pixels - 0.5), w.patch) + w.positions[0][xy[:, 0]] + w.positions[1][xy[:, 1]]
        for layer in w.layers:
            x = x + self._norm(self._attention(self._norm(x, layer.input_norm), layer, xy), layer.post_attention_norm)
            h = self._norm(x, layer.pre_feedforward_norm)
            x = x + self._norm(layer.down(gelu_tanh(layer.gate(h)) * layer.up(h)), layer.post_feedforward_norm)
        cells, columns = grid
        cell = (xy[:, 1] // c.pooling) * columns + xy[:, 0] // c.pooling
        pooled = x.new_zeros(cells, c.hidden_size).index_add_(0, cell, x) / c.pooling**2
        pooled = pooled * c.hidden_size**0.5
        if w.std_bias is not None and w.std_scale is not None:
            pooled = (pooled - w.std_bias) * w.std_scale
        return F.linear(rms_norm(pooled, torch.ones(()), c.rms_norm_eps), w.embedding)

    def tokens(self, positions: torch.Tensor) -> int:
        """How many image tokens the image with these patch ``positions`` becomes."""
        return self._pooled_grid(positions[(positions != -1).all(dim=-1)].long())[0]

    def _pooled_grid(self, xy: torch.Tensor) -> tuple[int, int]:
        """``(cells, columns)`` of the pooled grid over the real patches ``xy``."""
        k = self.config.pooling
        if xy.shape[0] == 0:
            raise HostModelInputError("an image's pixel_position_ids mark every patch as padding")
        columns, rows = (int(xy[:, i].max()) + 1 for i in (0, 1))
        if columns % k or rows % k or xy.shape[0] != columns * rows or int(xy.max()) >= self.config.positions:
            raise HostModelInputError(
                f"an image's {xy.shape[0]} real patches do not fill a {columns}x{rows} grid of sides divisible by "
                f"pooling_kernel_size={k} within position_embedding_size={self.config.positions}: send the Gemma 4 "
                "image processor's pixel_position_ids"
            )
        return (columns // k) * (rows // k), columns // k

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.config.rms_norm_eps)

    def _attention(self, h: torch.Tensor, layer: VisionLayerWeights, xy: torch.Tensor) -> torch.Tensor:
        """Unscaled attention of every real patch over all of them, the 2D rotary on q and k."""
        c = self.config
        n = h.shape[0]
        q = self._rotate(self._norm(layer.q(h).view(n, c.num_heads, c.head_dim), layer.q_norm), xy)
        k = self._rotate(self._norm(layer.k(h).view(n, c.num_kv_heads, c.head_dim), layer.k_norm), xy)
        v = rms_norm(layer.v(h).view(n, c.num_kv_heads, c.head_dim), torch.ones(()), c.rms_norm_eps)
        groups = c.num_heads // c.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=1.0)
        return layer.o(out.transpose(0, 1).reshape(n, -1))

    def _rotate(self, x: torch.Tensor, xy: torch.Tensor) -> torch.Tensor:
        """The first half of each head turned by the patch's column, the second by its row."""
        half = self.config.head_dim // 2
        return torch.cat((self.rotary.rotate(x[..., :half], xy[:, 0]), self.rotary.rotate(x[..., half:], xy[:, 1])),
                         dim=-1)
