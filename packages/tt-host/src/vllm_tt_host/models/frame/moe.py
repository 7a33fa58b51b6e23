"""GPT-OSS's mixture of experts: a top-k router and experts with a clamped SwiGLU.

The router keeps the ``top_k`` largest logits and softmaxes over those alone (not over all
experts). Each expert projects to interleaved gate/up columns (gate at even, up at odd
indices), clamps the gate from above and the up projection on both sides at ``limit``, and
computes ``(up + 1) * gate * sigmoid(alpha * gate)``; every projection has a bias. Weights are
kept as transformers 5 saves them: fused per layer, ``[experts, in, out]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MoeConfig:
    num_experts: int
    top_k: int
    swiglu_alpha: float
    swiglu_limit: float


@dataclass(frozen=True)
class ExpertWeights:
    router: torch.Tensor
    """``[experts, hidden]``"""
    router_bias: torch.Tensor
    gate_up: torch.Tensor
    """``[experts, hidden, 2 * intermediate]``, gate and up interleaved."""
    gate_up_bias: torch.Tensor
    down: torch.Tensor
    """``[experts, intermediate, hidden]``"""
    down_bias: torch.Tensor


def route(x: torch.Tensor, w: ExpertWeights, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts of each token of ``x [T, hidden]`` and their weights, both ``[T, top_k]``."""
    logits = F.linear(x, w.router, w.router_bias)
    top, experts = torch.topk(logits, top_k, dim=-1)
    return experts, torch.softmax(top, dim=-1)


def clamped_swiglu(gate_up: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    gate = gate_up[..., ::2].clamp(max=limit)
    up = gate_up[..., 1::2].clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))


def moe_mlp(x: torch.Tensor, w: ExpertWeights, cfg: MoeConfig) -> torch.Tensor:
    """The routed experts' weighted sum for each token of ``x [T, hidden]``."""

    def expert_mlp(expert: int, h: torch.Tensor) -> torch.Tensor:
        gate_up = h @ w.gate_up[expert] + w.gate_up_bias[expert]
        return clamped_swiglu(gate_up, cfg.swiglu_alpha, cfg.swiglu_limit) @ w.down[expert] + w.down_bias[expert]

    experts, weights = route(x, w, cfg.top_k)
    return combine_experts(x, experts, weights, expert_mlp)


def combine_experts(
    x: torch.Tensor,
    experts: torch.Tensor,
    weights: torch.Tensor,
    expert_mlp: Callable[[int, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_mlp(experts[t, k], x[t])`` for each token of
    ``x [T, hidden]`` (``experts``, ``weights``: ``[T, top_k]``); an expert runs only on the
    tokens routed to it, as the device's expert dispatch does."""
    out = torch.zeros_like(x)
    for expert in torch.unique(experts).tolist():
        tokens, rank = torch.where(experts == expert)
        out.index_add_(0, tokens, expert_mlp(expert, x[tokens]) * weights[tokens, rank, None])
    return out
