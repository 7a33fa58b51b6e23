"""YaRN rotary frequencies (GPT-OSS, DeepSeek V3): a per-frequency blend of interpolated and
original speeds; ``RotaryEmbedding`` adds the attention factor on cos/sin.

Frequencies that turn many times inside the original context keep their speed
(extrapolation), slow ones are divided by ``factor`` (interpolation), and a linear ramp
between the ``beta_fast`` and ``beta_slow`` rotation counts blends the two. The factor
``0.1 ln(factor) + 1`` multiplies cos and sin, so q.k grows by its square; it is easy to leave
out and it changes every logit. The arithmetic follows transformers' order (float32).
"""

from __future__ import annotations

import math

import torch

from vllm_tt_host.models.frame.rope_config import YarnScaling


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


def _dimension_of(rotations: float, head_dim: int, theta: float, context: int) -> float:
    """The (fractional) dimension whose frequency turns ``rotations`` times in ``context``."""
    return (head_dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(theta))
