"""Rotary position embedding with the default, linear and Llama 3.1 ("llama3") frequencies.

The arithmetic follows the order HF uses (float32 throughout) so that greedy decoding agrees
with transformers token for token, not just approximately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vllm_tt_host.models.frame.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """One rotation speed per pair of head dimensions, ``[head_dim // 2]``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim
    inv = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "llama3":
        inv = _llama3_frequencies(inv, rope)
    elif rope.rope_type == "linear":  # positions divided by ``factor`` (Gemma 3's global layers)
        inv = inv / rope.factor
    return inv


def _llama3_frequencies(inv: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    """Llama 3.1 stretches long wavelengths by ``factor``, keeps short ones, and blends linearly
    in between, so a model trained on ``original_max_position_embeddings`` reaches further."""
    context = rope.original_max_position_embeddings
    wavelength = 2 * math.pi / inv
    slowed = inv / rope.factor
    blend = (context / wavelength - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    mixed = (1 - blend) * inv / rope.factor + blend * inv
    long_wave = wavelength > context / rope.low_freq_factor
    short_wave = wavelength < context / rope.high_freq_factor
    return torch.where(short_wave, inv, torch.where(long_wave, slowed, mixed))


@dataclass(frozen=True)
class RotaryEmbedding:
    inv_freq: torch.Tensor

    @classmethod
    def of(cls, rope: RopeConfig, head_dim: int) -> RotaryEmbedding:
        return cls(inverse_frequencies(rope, head_dim))

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``[T, heads, head_dim]`` by the angles of ``positions [T]``."""
        freqs = positions[:, None].to(torch.float32) * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * angles.cos() + rotated * angles.sin()
