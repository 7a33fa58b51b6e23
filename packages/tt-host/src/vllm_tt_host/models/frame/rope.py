"""Rotary position embedding: the default, linear, Llama 3.1 ("llama3"), proportional
(Gemma 4) and YaRN (``yarn``) frequencies of a ``RopeConfig``, and the rotation itself.

The arithmetic follows the order HF uses (float32 throughout) so that greedy decoding agrees
with transformers token for token, not just approximately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vllm_tt_host.models.frame.rope_config import RopeConfig
from vllm_tt_host.models.frame.yarn import yarn_frequencies


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """One rotation speed per pair of head dimensions, ``[head_dim // 2]``."""
    if rope.yarn is not None:
        return yarn_frequencies(rope.theta, head_dim, rope.yarn)
    if rope.rope_type == "proportional":
        return _proportional_frequencies(rope, head_dim)
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


def _proportional_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """The first ``rotary_fraction`` of the pairs turn at the speeds a whole head of
    ``head_dim`` would give them (divided by ``factor``), the rest stand still."""
    rotated = int(rope.rotary_fraction * head_dim // 2)
    exponents = torch.arange(0, 2 * rotated, 2, dtype=torch.float32) / head_dim
    inv = torch.cat((1.0 / (rope.theta**exponents), torch.zeros(head_dim // 2 - rotated)))
    return inv / rope.factor


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` rotated by angles whose ``cos`` and ``sin`` cover the whole last dimension; the
    pairs are ``(i, i + d/2)`` (transformers' ``rotate_half``)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class RotaryEmbedding:
    inv_freq: torch.Tensor
    scale: float = 1.0
    """YaRN's attention factor on cos and sin (1: none)."""

    @classmethod
    def of(cls, rope: RopeConfig, head_dim: int) -> RotaryEmbedding:
        return cls(inverse_frequencies(rope, head_dim), rope.yarn.cos_sin_scale if rope.yarn is not None else 1.0)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``[T, heads, head_dim]`` by the angles of ``positions [T]``."""
        freqs = positions[:, None].to(torch.float32) * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        out = apply_rotary(x, angles.cos(), angles.sin())
        return out if self.scale == 1.0 else out * self.scale
