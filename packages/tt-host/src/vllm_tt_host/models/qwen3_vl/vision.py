"""The Qwen3-VL vision tower in torch: patches of one image in, one vector per merged
``merge x merge`` patch unit out, plus the DeepStack features, as transformers'
``Qwen3VLVisionModel`` computes them.

Against Qwen2.5-VL's tower (``frame.patch_grid`` holds what both share): the patch embedding
has a bias and a learned position embedding, a square table resampled bilinearly (corners
aligned) to each image's patch grid; blocks are LayerNorm + GELU MLP and all attend within a
frame (no windows); the merger LayerNorms each patch before concatenating a unit. DeepStack:
after each block of ``deepstack_visual_indexes`` a merger of its own (LayerNorm over the
concatenated unit) turns the hidden states into one more set of unit features; the decoder adds
set ``k`` to the image positions after its layer ``k``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import WeightFolder
from vllm_tt_host.models.frame.config import model_name, positive_int, vision_activation
from vllm_tt_host.models.frame.linear import Linear
from vllm_tt_host.models.frame.mlp import gelu_tanh
from vllm_tt_host.models.frame.patch_grid import AxialRotary, PatchGridConfig, PatchLayout, patch_attention
from vllm_tt_host.models.frame.vision import PixelNorm

NORM_EPS = 1e-6
"""The tower's LayerNorms (blocks and mergers) use transformers' fixed epsilon."""
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"gelu_pytorch_tanh": gelu_tanh, "gelu": F.gelu}
"""The block MLP activations the host tower implements (the mergers always use exact GELU)."""


@dataclass(frozen=True)
class Qwen3VisionConfig(PatchGridConfig):
    activation: str
    num_position_embeddings: int
    deepstack_blocks: tuple[int, ...]
    """The blocks whose output feeds a DeepStack merger, in the order the decoder layers take them."""

    @property
    def grid_side(self) -> int:
        """Side of the square learned position table."""
        return int(self.num_position_embeddings**0.5)

    @classmethod
    def from_hf(cls, vision: Any) -> Qwen3VisionConfig:
        model = model_name(vision)
        positions = positive_int(vision, "num_position_embeddings", model)
        if int(positions**0.5) ** 2 != positions:
            raise TTConfigError(f"{model}: vision_config.num_position_embeddings", positions, "a square number",
                                "check the checkpoint's config.json")
        fields = cls.grid_fields(vision)
        blocks = tuple(int(i) for i in getattr(vision, "deepstack_visual_indexes", ()) or ())
        if any(not 0 <= i < fields["depth"] for i in blocks):
            raise TTConfigError(f"{model}: vision_config.deepstack_visual_indexes", list(blocks),
                                f"block indices in 0..{fields['depth'] - 1}", "check the checkpoint's config.json")
        return cls(**fields, activation=vision_activation(vision, model, tuple(ACTIVATIONS)),
                   num_position_embeddings=positions, deepstack_blocks=blocks)


@dataclass(frozen=True)
class BlockWeights:
    norm1: Linear
    """LayerNorm weight and bias (a ``Linear`` pair only as storage), as ``norm2``."""
    norm2: Linear
    qkv: Linear
    proj: Linear
    fc1: Linear
    fc2: Linear


@dataclass(frozen=True)
class MergerWeights:
    norm: Linear
    fc1: Linear
    fc2: Linear


@dataclass(frozen=True)
class Qwen3VisionWeights:
    patch: Linear
    """The patch Conv3d, its kernel flattened to ``[hidden, C * T * P * P]`` (kernel = stride)."""
    positions: torch.Tensor
    """``[side * side, hidden]``: the learned position table, row-major."""
    blocks: tuple[BlockWeights, ...]
    merger: MergerWeights
    deepstack: tuple[MergerWeights, ...]


def load_qwen3_vision_weights(reader: WeightFolder, prefix: str, config: Qwen3VisionConfig) -> Qwen3VisionWeights:
    """The tower's tensors under ``prefix`` (``model.visual.`` as transformers 5 writes it)."""

    def pair(name: str) -> Linear:
        return Linear(reader.tensor(f"{prefix}{name}.weight"), reader.tensor(f"{prefix}{name}.bias"))

    def merger(name: str) -> MergerWeights:
        return MergerWeights(pair(f"{name}.norm"), pair(f"{name}.linear_fc1"), pair(f"{name}.linear_fc2"))

    blocks = tuple(
        BlockWeights(norm1=pair(f"{p}norm1"), norm2=pair(f"{p}norm2"), qkv=pair(f"{p}attn.qkv"),
                     proj=pair(f"{p}attn.proj"), fc1=pair(f"{p}mlp.linear_fc1"), fc2=pair(f"{p}mlp.linear_fc2"))
        for p in (f"blocks.{i}." for i in range(config.depth))
    )
    patch = pair("patch_embed.proj")
    return Qwen3VisionWeights(
        patch=Linear(config.patch_kernel(patch.weight, f"{prefix}patch_embed.proj.weight"), patch.bias),
        positions=reader.tensor(f"{prefix}pos_embed.weight"), blocks=blocks, merger=merger("merger"),
        deepstack=tuple(merger(f"deepstack_merger_list.{k}") for k in range(len(config.deepstack_blocks))),
    )


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps ``[n, 2]`` into a ``side``-long table for positions ``index`` of an axis of
    ``size`` (corners aligned: position 0 at entry 0, position ``size - 1`` at ``side - 1``)."""
    source = index.to(torch.float32) * (side - 1) / max(size - 1, 1)
    low = source.floor()
    frac = source - low
    taps = (low.long()[:, None] + torch.arange(2)).clamp(max=side - 1)
    return taps, torch.stack((1 - frac, frac), dim=-1)


class Qwen3VisionTower:
    def __init__(self, config: Qwen3VisionConfig, weights: Qwen3VisionWeights, norm: PixelNorm) -> None:
        self.config = config
        self.weights = weights
        self.norm = norm
        self.rotary = AxialRotary(config)
        self.act = ACTIVATIONS[config.activation]

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
        """One image ``[t*h*w, C*T*P*P]`` -> its merged features ``[t*h*w / merge**2,
        out_hidden_size]``, then one DeepStack set of that shape per ``deepstack_blocks`` entry."""
        cfg, w = self.config, self.weights
        cfg.check_pixels(pixel_values, grid_thw)
        layout = PatchLayout.of(grid_thw, cfg.merge_size)
        x = w.patch(self.norm.apply(pixel_values, cfg.in_channels)) + self._positions(layout, grid_thw)
        cos, sin = self.rotary(layout)
        mask = layout.same_frame()
        deepstack: dict[int, torch.Tensor] = {}
        for index, block in enumerate(w.blocks):
            x = x + patch_attention(block.norm1.layer_norm(x, NORM_EPS), block.qkv, block.proj, cfg.num_heads,
                                    cos, sin, mask)
            x = x + block.fc2(self.act(block.fc1(block.norm2.layer_norm(x, NORM_EPS))))
            if index in cfg.deepstack_blocks:
                k = cfg.deepstack_blocks.index(index)
                deepstack[k] = self._merge(x, w.deepstack[k], after_concat=True)
        return (self._merge(x, w.merger, after_concat=False), *(deepstack[k] for k in sorted(deepstack)))

    def _positions(self, layout: PatchLayout, grid_thw: tuple[int, int, int]) -> torch.Tensor:
        """Each patch's learned position: the table resampled bilinearly to the ``h x w`` grid."""
        side = self.config.grid_side
        row_taps, row_weights = _axis_taps(layout.rows, grid_thw[1], side)
        col_taps, col_weights = _axis_taps(layout.cols, grid_thw[2], side)
        taps = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
        weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
        return (self.weights.positions[taps] * weights[:, :, None]).sum(1)

    def _merge(self, x: torch.Tensor, m: MergerWeights, after_concat: bool) -> torch.Tensor:
        """Concatenate the ``merge**2`` patches of each unit (LayerNorm before, or for DeepStack
        after), then ``fc2(gelu(fc1))``."""
        width = x.shape[-1] * self.config.merge_size**2
        units = m.norm.layer_norm(x.reshape(-1, width), NORM_EPS) if after_concat else (
            m.norm.layer_norm(x, NORM_EPS).reshape(-1, width))
        return m.fc2(F.gelu(m.fc1(units)))
