"""What the Qwen-VL vision towers (Qwen2.5-VL, Qwen3-VL) share: the ``vision_config`` fields
both spell the same way, where each patch of an image sits (merge-unit order, as vLLM's and
HF's processors flatten them), the axial 2D rotary over those coordinates, and the attention
of one block over the patches a mask lets meet.

Pixel values come as the processor flattens them: ``[patches, C * T * P * P]``, patches in
merge-unit order (``t, h / m, w / m, m, m``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import torch
import torch.nn.functional as F
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.checkpoint import CheckpointError
from vllm_tt_host.models.frame.config import model_name, positive_int
from vllm_tt_host.models.frame.linear import Linear
from vllm_tt_host.models.frame.rope import apply_rotary
from vllm_tt_host.models.frame.shapes import HostModelInputError


@dataclass(frozen=True)
class PatchGridConfig:
    """The fields of a Qwen-VL ``vision_config`` every tower reads the same way."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    in_channels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_width(self) -> int:
        """Values per patch: ``C * T * P * P``."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @classmethod
    def from_hf(cls, vision: Any) -> Self:
        """This tower's config from an HF ``vision_config`` (each tower reads its own fields)."""
        raise NotImplementedError(f"{cls.__name__} does not read a vision_config")

    @staticmethod
    def grid_fields(vision: Any) -> dict[str, Any]:
        """These fields from an HF ``vision_config``, checked."""
        model = model_name(vision)
        heads = positive_int(vision, "num_heads", model)
        hidden = positive_int(vision, "hidden_size", model)
        if hidden % heads or (hidden // heads) % 4:
            raise TTConfigError(f"{model}: vision_config.num_heads", heads,
                                f"a divisor of hidden_size={hidden} leaving a head size divisible by 4",
                                "check the checkpoint's config.json")
        rope = dict(getattr(vision, "rope_parameters", None) or {})
        return {
            "depth": positive_int(vision, "depth", model), "hidden_size": hidden, "num_heads": heads,
            "intermediate_size": positive_int(vision, "intermediate_size", model),
            "out_hidden_size": positive_int(vision, "out_hidden_size", model),
            "in_channels": positive_int(vision, "in_channels", model),
            "patch_size": positive_int(vision, "patch_size", model),
            "temporal_patch_size": positive_int(vision, "temporal_patch_size", model),
            "merge_size": positive_int(vision, "spatial_merge_size", model),
            "rope_theta": float(rope.get("rope_theta", 10000.0)),
        }

    def check_pixels(self, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> None:
        count = grid_thw[0] * grid_thw[1] * grid_thw[2]
        if tuple(pixel_values.shape) != (count, self.patch_width):
            raise HostModelInputError(
                f"pixel_values of shape {tuple(pixel_values.shape)} do not match image_grid_thw {grid_thw}: "
                f"expected [{count}, {self.patch_width}]"
            )

    def patch_kernel(self, weight: torch.Tensor, name: str) -> torch.Tensor:
        """The patch Conv3d's kernel (kernel = stride) flattened to ``[hidden, C * T * P * P]``."""
        if tuple(weight.shape[1:]) != (self.in_channels, self.temporal_patch_size, self.patch_size, self.patch_size):
            raise CheckpointError(f"{name} has shape {tuple(weight.shape)}, which config.json's vision_config "
                                  "does not imply")
        return weight.reshape(weight.shape[0], -1)


@dataclass(frozen=True)
class PatchLayout:
    """Where each patch of one image sits, in the processor's merge-unit order."""

    rows: torch.Tensor
    cols: torch.Tensor
    frames: torch.Tensor
    """Temporal patch index (an image has one; attention stays within a frame)."""

    @classmethod
    def of(cls, grid_thw: tuple[int, int, int], merge: int) -> PatchLayout:
        t, h, w = grid_thw
        if h % merge or w % merge:
            raise HostModelInputError(f"image_grid_thw {grid_thw}: h and w must be multiples of {merge}")
        unit_rows, unit_cols = unit_grid(h, w, merge)
        in_rows, in_cols = torch.meshgrid(torch.arange(merge), torch.arange(merge), indexing="ij")
        # [units, m*m]: patch (r, c) of unit (R, C) is at row R*m + r, column C*m + c.
        rows = (unit_rows.reshape(-1, 1) * merge + in_rows.reshape(1, -1)).reshape(-1)
        cols = (unit_cols.reshape(-1, 1) * merge + in_cols.reshape(1, -1)).reshape(-1)
        frames = torch.arange(t).repeat_interleave(rows.numel())
        return cls(rows.repeat(t), cols.repeat(t), frames)

    def same_frame(self) -> torch.Tensor | None:
        """The mask of patch pairs in one frame (None: a single frame, all pairs)."""
        if int(self.frames.max()) == 0:
            return None
        return self.frames[:, None] == self.frames[None, :]


def unit_grid(h: int, w: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column ``[h / m, w / m]`` of each merge unit of an ``h x w`` patch grid."""
    rows, cols = torch.meshgrid(torch.arange(h // merge), torch.arange(w // merge), indexing="ij")
    return rows, cols


class AxialRotary:
    """The towers' 2D rotary: the first half of the rotated pairs turn with the patch row, the
    second with its column, at the speeds of a ``head_dim / 2`` rope."""

    def __init__(self, config: PatchGridConfig) -> None:
        spatial = config.head_dim // 2
        self.inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, spatial, 2, dtype=torch.float32) / spatial))

    def __call__(self, layout: PatchLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """``[patches, head_dim]`` cos and sin."""
        freqs = torch.cat((layout.rows[:, None].float() * self.inv_freq, layout.cols[:, None].float() * self.inv_freq),
                          dim=-1)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()


def patch_attention(h: torch.Tensor, qkv: Linear, proj: Linear, heads: int, cos: torch.Tensor, sin: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """One block's attention over ``h [patches, hidden]``: fused q/k/v, 2D rotary on q and k,
    bidirectional among the pairs ``mask`` allows (None: all), output projection."""
    n = h.shape[0]
    q, k, v = qkv(h).reshape(n, 3, heads, -1).unbind(1)
    q, k = (apply_rotary(t, cos[:, None], sin[:, None]) for t in (q, k))
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         attn_mask=mask, scale=q.shape[-1] ** -0.5)
    return proj(out.transpose(0, 1).reshape(n, -1))
