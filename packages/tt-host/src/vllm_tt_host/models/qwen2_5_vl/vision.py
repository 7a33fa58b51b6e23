"""The Qwen2.5-VL vision tower in torch: patches of one image in, one vector per merged
``merge x merge`` patch unit out (the text width), as transformers' ``Qwen2_5_Vision...`` does.

Pixel values come as vLLM's processor flattens them: ``[patches, C * T * P * P]``, patches in
merge-unit order (``t, h / m, w / m, m, m``). uint8 values (vLLM's default
``mm_device_do_normalize``) are rescaled and normalised here with the checkpoint's image
processor constants; float values are taken as already normalised.

Blocks attend within the image (``fullatt_block_indexes``) or within square windows of
``window_size`` pixels (the others). Transformers reorders the patches window by window and
attends over contiguous spans; here the patches stay in place and a mask says which pairs may
attend, which is the same attention.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError

from vllm_tt_host.models.frame.checkpoint import CheckpointError, WeightFolder
from vllm_tt_host.models.frame.config import model_name, positive_int
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.rope import apply_rotary
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import PixelNorm

NORM_EPS = 1e-6
"""The tower's RMSNorms keep transformers' default epsilon."""


@dataclass(frozen=True)
class VisionConfig:
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    window_size: int
    full_attention_blocks: tuple[int, ...]
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_width(self) -> int:
        """Values per patch: ``C * T * P * P``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def window_units(self) -> int:
        """Window side in merge units (transformers' ``vit_merger_window_size``)."""
        return self.window_size // self.merge_size // self.patch_size

    @classmethod
    def from_hf(cls, vision: Any) -> VisionConfig:
        model = model_name(vision)
        act = getattr(vision, "hidden_act", "silu")
        if act != "silu":
            raise TTUnsupportedFeatureError(f"{model}: vision_config.hidden_act", act, "silu",
                                            "serve this model with a ttnn mesh")
        heads = positive_int(vision, "num_heads", model)
        hidden = positive_int(vision, "hidden_size", model)
        if hidden % heads or (hidden // heads) % 4:
            raise TTConfigError(f"{model}: vision_config.num_heads", heads,
                                f"a divisor of hidden_size={hidden} leaving a head size divisible by 4",
                                "check the checkpoint's config.json")
        rope = dict(getattr(vision, "rope_parameters", None) or {})
        config = cls(
            depth=positive_int(vision, "depth", model), hidden_size=hidden, num_heads=heads,
            intermediate_size=positive_int(vision, "intermediate_size", model),
            out_hidden_size=positive_int(vision, "out_hidden_size", model),
            in_channels=positive_int(vision, "in_channels", model),
            patch_size=positive_int(vision, "patch_size", model),
            temporal_patch_size=positive_int(vision, "temporal_patch_size", model),
            merge_size=positive_int(vision, "spatial_merge_size", model),
            window_size=positive_int(vision, "window_size", model),
            full_attention_blocks=tuple(int(i) for i in getattr(vision, "fullatt_block_indexes", ()) or ()),
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )
        if config.window_units < 1:
            raise TTConfigError(f"{model}: vision_config.window_size", config.window_size,
                                f"at least spatial_merge_size * patch_size = {config.merge_size * config.patch_size}",
                                "check the checkpoint's config.json")
        return config


@dataclass(frozen=True)
class VisionBlockWeights:
    norm1: torch.Tensor
    norm2: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor
    proj: torch.Tensor
    proj_bias: torch.Tensor
    gate: torch.Tensor
    gate_bias: torch.Tensor
    up: torch.Tensor
    up_bias: torch.Tensor
    down: torch.Tensor
    down_bias: torch.Tensor


@dataclass(frozen=True)
class VisionWeights:
    patch_embed: torch.Tensor
    """The patch Conv3d's kernel flattened to ``[hidden, C * T * P * P]`` (kernel = stride)."""
    blocks: tuple[VisionBlockWeights, ...]
    merger_norm: torch.Tensor
    merger_fc1: torch.Tensor
    merger_fc1_bias: torch.Tensor
    merger_fc2: torch.Tensor
    merger_fc2_bias: torch.Tensor


def load_vision_weights(reader: WeightFolder, prefix: str, config: VisionConfig) -> VisionWeights:
    """The tower's tensors under ``prefix`` (``model.visual.`` as transformers 5 writes it)."""
    get = reader.tensor
    blocks = []
    for i in range(config.depth):
        p = f"{prefix}blocks.{i}."
        blocks.append(VisionBlockWeights(
            norm1=get(p + "norm1.weight"), norm2=get(p + "norm2.weight"),
            qkv=get(p + "attn.qkv.weight"), qkv_bias=get(p + "attn.qkv.bias"),
            proj=get(p + "attn.proj.weight"), proj_bias=get(p + "attn.proj.bias"),
            gate=get(p + "mlp.gate_proj.weight"), gate_bias=get(p + "mlp.gate_proj.bias"),
            up=get(p + "mlp.up_proj.weight"), up_bias=get(p + "mlp.up_proj.bias"),
            down=get(p + "mlp.down_proj.weight"), down_bias=get(p + "mlp.down_proj.bias"),
        ))
    patch = get(prefix + "patch_embed.proj.weight")
    if tuple(patch.shape[1:]) != (config.in_channels, config.temporal_patch_size, config.patch_size, config.patch_size):
        raise CheckpointError(f"{prefix}patch_embed.proj.weight has shape {tuple(patch.shape)}, which "
                              "config.json's vision_config does not imply")
    return VisionWeights(
        patch_embed=patch.reshape(patch.shape[0], -1), blocks=tuple(blocks),
        merger_norm=get(prefix + "merger.ln_q.weight"),
        merger_fc1=get(prefix + "merger.mlp.0.weight"), merger_fc1_bias=get(prefix + "merger.mlp.0.bias"),
        merger_fc2=get(prefix + "merger.mlp.2.weight"), merger_fc2_bias=get(prefix + "merger.mlp.2.bias"),
    )


@dataclass(frozen=True)
class PatchLayout:
    """Where each patch of one image sits: its row and column (for the 2D rotary) and its
    attention window, in the processor's merge-unit order."""

    rows: torch.Tensor
    cols: torch.Tensor
    windows: torch.Tensor
    frames: torch.Tensor
    """Temporal patch index (an image has one; full attention stays within a frame)."""

    @classmethod
    def of(cls, grid_thw: tuple[int, int, int], config: VisionConfig) -> PatchLayout:
        t, h, w = grid_thw
        m = config.merge_size
        if h % m or w % m:
            raise HostModelInputError(f"image_grid_thw {grid_thw}: h and w must be multiples of {m}")
        unit_rows, unit_cols = torch.meshgrid(torch.arange(h // m), torch.arange(w // m), indexing="ij")
        in_rows, in_cols = torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")
        # [units, m*m]: patch (r, c) of unit (R, C) is at row R*m + r, column C*m + c.
        rows = (unit_rows.reshape(-1, 1) * m + in_rows.reshape(1, -1)).reshape(-1)
        cols = (unit_cols.reshape(-1, 1) * m + in_cols.reshape(1, -1)).reshape(-1)
        side = config.window_units
        windows_per_row = -(-(w // m) // side)
        unit_window = (unit_rows // side) * windows_per_row + unit_cols // side
        windows = unit_window.reshape(-1).repeat_interleave(m * m)
        frames = torch.arange(t).repeat_interleave(rows.numel())  # a window never spans frames
        windows = windows.repeat(t) + frames * int(windows.max() + 1)
        return cls(rows.repeat(t), cols.repeat(t), windows, frames)


class VisionTower:
    def __init__(self, config: VisionConfig, weights: VisionWeights, norm: PixelNorm) -> None:
        self.config = config
        self.weights = weights
        self.norm = norm
        spatial = config.head_dim // 2
        self.inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32) / spatial))

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> torch.Tensor:
        """One image: ``[t*h*w, C*T*P*P]`` -> ``[t*h*w / merge**2, out_hidden_size]``."""
        cfg = self.config
        count = grid_thw[0] * grid_thw[1] * grid_thw[2]
        if tuple(pixel_values.shape) != (count, cfg.patch_width):
            raise HostModelInputError(
                f"pixel_values of shape {tuple(pixel_values.shape)} do not match image_grid_thw {grid_thw}: "
                f"expected [{count}, {cfg.patch_width}]"
            )
        layout = PatchLayout.of(grid_thw, cfg)
        x = self.norm.apply(pixel_values, cfg.in_channels) @ self.weights.patch_embed.T
        cos, sin = self._rotary(layout)
        same_window = layout.windows[:, None] == layout.windows[None, :]
        same_frame = None if grid_thw[0] == 1 else layout.frames[:, None] == layout.frames[None, :]
        for index, block in enumerate(self.weights.blocks):
            mask = same_frame if index in cfg.full_attention_blocks else same_window
            x = x + self._attend(rms_norm(x, block.norm1, NORM_EPS), block, cos, sin, mask)
            h = rms_norm(x, block.norm2, NORM_EPS)
            x = x + F.linear(F.silu(F.linear(h, block.gate, block.gate_bias)) * F.linear(h, block.up, block.up_bias),
                             block.down, block.down_bias)
        return self._merge(x)

    def _rotary(self, layout: PatchLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Axial 2D rotary: the first half of the rotated pairs turn with the row, the second
        with the column; ``[patches, head_dim]`` cos and sin."""
        freqs = torch.cat((layout.rows[:, None].float() * self.inv_freq, layout.cols[:, None].float() * self.inv_freq),
                          dim=-1)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()

    def _attend(self, h: torch.Tensor, block: VisionBlockWeights, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        cfg = self.config
        n = h.shape[0]
        q, k, v = F.linear(h, block.qkv, block.qkv_bias).reshape(n, 3, cfg.num_heads, cfg.head_dim).unbind(1)
        q, k = (apply_rotary(t, cos[:, None], sin[:, None]) for t in (q, k))
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             attn_mask=mask, scale=cfg.head_dim**-0.5)
        return F.linear(out.transpose(0, 1).reshape(n, -1), block.proj, block.proj_bias)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        """Norm each patch, concatenate the ``merge**2`` patches of a unit, two-layer GELU MLP."""
        w = self.weights
        units = rms_norm(x, w.merger_norm, NORM_EPS).reshape(-1, x.shape[-1] * self.config.merge_size**2)
        return F.linear(F.gelu(F.linear(units, w.merger_fc1, w.merger_fc1_bias)), w.merger_fc2, w.merger_fc2_bias)
