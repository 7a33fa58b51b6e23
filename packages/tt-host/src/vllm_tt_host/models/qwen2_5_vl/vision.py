"""The Qwen2.5-VL vision tower in torch: patches of one image in, one vector per merged
``merge x merge`` patch unit out (the text width), as transformers' ``Qwen2_5_Vision...`` does.

Pixel values come as vLLM's processor flattens them (``frame.patch_grid``). uint8 values (vLLM's default
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

from vllm_tt_host.models.frame.checkpoint import WeightFolder
from vllm_tt_host.models.frame.config import model_name, positive_int
from vllm_tt_host.models.frame.linear import Linear
from vllm_tt_host.models.frame.norms import rms_norm
from vllm_tt_host.models.frame.patch_grid import (
    AxialRotary,
    PatchGridConfig,
    PatchLayout,
    patch_attention,
    unit_grid,
)
from vllm_tt_host.models.frame.vision import PixelNorm

NORM_EPS = 1e-6
"""The tower's RMSNorms keep transformers' default epsilon."""


@dataclass(frozen=True)
class VisionConfig(PatchGridConfig):
    window_size: int
    full_attention_blocks: tuple[int, ...]

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
        config = cls(
            **cls.grid_fields(vision), window_size=positive_int(vision, "window_size", model),
            full_attention_blocks=tuple(int(i) for i in getattr(vision, "fullatt_block_indexes", ()) or ()),
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
    qkv: Linear
    proj: Linear
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

    def pair(name: str) -> Linear:
        return Linear(get(f"{name}.weight"), get(f"{name}.bias"))

    blocks = []
    for i in range(config.depth):
        p = f"{prefix}blocks.{i}."
        blocks.append(VisionBlockWeights(
            norm1=get(p + "norm1.weight"), norm2=get(p + "norm2.weight"),
            qkv=pair(p + "attn.qkv"), proj=pair(p + "attn.proj"),
            gate=get(p + "mlp.gate_proj.weight"), gate_bias=get(p + "mlp.gate_proj.bias"),
            up=get(p + "mlp.up_proj.weight"), up_bias=get(p + "mlp.up_proj.bias"),
            down=get(p + "mlp.down_proj.weight"), down_bias=get(p + "mlp.down_proj.bias"),
        ))
    name = prefix + "patch_embed.proj.weight"
    return VisionWeights(
        patch_embed=config.patch_kernel(get(name), name), blocks=tuple(blocks),
        merger_norm=get(prefix + "merger.ln_q.weight"),
        merger_fc1=get(prefix + "merger.mlp.0.weight"), merger_fc1_bias=get(prefix + "merger.mlp.0.bias"),
        merger_fc2=get(prefix + "merger.mlp.2.weight"), merger_fc2_bias=get(prefix + "merger.mlp.2.bias"),
    )


def attention_windows(grid_thw: tuple[int, int, int], config: VisionConfig) -> torch.Tensor:
    """Each patch's attention window (merge-unit order); a window never spans frames."""
    t, h, w = grid_thw
    m, side = config.merge_size, config.window_units
    unit_rows, unit_cols = unit_grid(h, w, m)
    windows_per_row = -(-(w // m) // side)
    unit_window = (unit_rows // side) * windows_per_row + unit_cols // side
    windows = unit_window.reshape(-1).repeat_interleave(m * m)
    frames = torch.arange(t).repeat_interleave(windows.numel())
    return windows.repeat(t) + frames * int(windows.max() + 1)


class VisionTower:
    def __init__(self, config: VisionConfig, weights: VisionWeights, norm: PixelNorm) -> None:
        self.config = config
        self.weights = weights
        self.norm = norm
        self.rotary = AxialRotary(config)

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> torch.Tensor:
        """One image: ``[t*h*w, C*T*P*P]`` -> ``[t*h*w / merge**2, out_hidden_size]``."""
        cfg = self.config
        cfg.check_pixels(pixel_values, grid_thw)
        layout = PatchLayout.of(grid_thw, cfg.merge_size)
        x = self.norm.apply(pixel_values, cfg.in_channels) @ self.weights.patch_embed.T
        cos, sin = self.rotary(layout)
        windows = attention_windows(grid_thw, cfg)
        same_window = windows[:, None] == windows[None, :]
        same_frame = layout.same_frame()
        for index, block in enumerate(self.weights.blocks):
            mask = same_frame if index in cfg.full_attention_blocks else same_window
            h = rms_norm(x, block.norm1, NORM_EPS)
            x = x + patch_attention(h, block.qkv, block.proj, cfg.num_heads, cos, sin, mask)
            h = rms_norm(x, block.norm2, NORM_EPS)
            x = x + F.linear(F.silu(F.linear(h, block.gate, block.gate_bias)) * F.linear(h, block.up, block.up_bias),
                             block.down, block.down_bias)
        return self._merge(x)

    def _merge(self, x: torch.Tensor) -> torch.Tensor:
        """Norm each patch, concatenate the ``merge**2`` patches of a unit, two-layer GELU MLP."""
        w = self.weights
        units = rms_norm(x, w.merger_norm, NORM_EPS).reshape(-1, x.shape[-1] * self.config.merge_size**2)
        return F.linear(F.gelu(F.linear(units, w.merger_fc1, w.merger_fc1_bias)), w.merger_fc2, w.merger_fc2_bias)
