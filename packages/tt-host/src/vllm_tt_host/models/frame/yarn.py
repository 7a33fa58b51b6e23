"""YaRN rotary scaling (GPT-OSS): per-frequency blend of interpolated and original speeds,
plus an attention factor on cos/sin.

Frequencies that turn many times inside the original context keep their speed
(extrapolation), slow ones are divided by ``factor`` (interpolation), and a linear ramp
between the ``beta_fast`` and ``beta_slow`` rotation counts blends the two. The factor
``0.1 ln(factor) + 1`` multiplies cos and sin, so q.k grows by its square; it is easy to leave
out and it changes every logit. The arithmetic follows transformers' order (float32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.models.frame.rope import RotaryEmbedding


@dataclass(frozen=True)
class YarnScaling:
    """YaRN's parameters as ``rope_parameters`` names them (HF defaults where optional)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    """Round the ramp's ends to whole dimensions (HF's default; GPT-OSS turns it off)."""
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None

    @classmethod
    def from_rope_parameters(
        cls, params: Mapping[str, Any], max_position_embeddings: int, model: str
    ) -> YarnScaling:
        original = params.get("original_max_position_embeddings")
        if not isinstance(original, int) or original <= 0:
            raise TTConfigError(
                f"{model}: rope_parameters.original_max_position_embeddings",
                original,
                "a positive int (YaRN needs the pre-training context)",
                "add it to the checkpoint's rope_parameters",
            )
        factor = params.get("factor")
        return cls(
            factor=float(factor) if factor is not None else max_position_embeddings / original,
            original_max_position_embeddings=original,
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            truncate=bool(params.get("truncate", True)),
            attention_factor=_optional_float(params.get("attention_factor")),
            mscale=_optional_float(params.get("mscale")),
            mscale_all_dim=_optional_float(params.get("mscale_all_dim")),
        )

    @property
    def cos_sin_scale(self) -> float:
        """The factor on cos and sin: given, or from ``mscale`` / ``mscale_all_dim``, or
        ``0.1 ln(factor) + 1``."""
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return _mscale(self.factor, self.mscale) / _mscale(self.factor, self.mscale_all_dim)
        return _mscale(self.factor)

    @property
    def softmax_scale_factor(self) -> float:
        """DeepSeek's correction of the attention scale: ``mscale(factor, mscale_all_dim)``
        squared (1 without ``mscale_all_dim``)."""
        return _mscale(self.factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0


def yarn_frequencies(theta: float, head_dim: int, yarn: YarnScaling) -> torch.Tensor:
    """The blended inverse frequencies ``[head_dim // 2]``."""
    speeds = theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    original = 1.0 / speeds
    interpolated = 1.0 / (yarn.factor * speeds)
    context = yarn.original_max_position_embeddings
    low = _dimension_of(yarn.beta_fast, head_dim, theta, context)
    high = _dimension_of(yarn.beta_slow, head_dim, theta, context)
    if yarn.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return interpolated * (1 - keep) + original * keep


@dataclass(frozen=True)
class ScaledRotaryEmbedding(RotaryEmbedding):
    """A rotary embedding whose cos and sin carry YaRN's attention factor."""

    scale: float = 1.0

    @classmethod
    def yarn(cls, theta: float, head_dim: int, yarn: YarnScaling) -> ScaledRotaryEmbedding:
        return cls(yarn_frequencies(theta, head_dim, yarn), yarn.cos_sin_scale)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return super().rotate(x, positions) * self.scale


def _dimension_of(rotations: float, head_dim: int, theta: float, context: int) -> float:
    """The (fractional) dimension whose frequency turns ``rotations`` times in ``context``."""
    return (head_dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(theta))


def _mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
