"""DeepSeek V3's experts: group-limited top-k routing over sigmoid scores, plus shared experts.

The router scores every expert with a sigmoid (not a softmax). To choose, it adds a learned
per-expert correction bias, ranks the ``n_group`` groups by the sum of their two best biased
scores, keeps the ``topk_group`` best groups and takes the ``top_k`` best experts inside them
(vLLM's ``noaux_tc``). The bias only chooses: the weights are the chosen experts' unbiased
scores, renormalised to sum to one (``norm_topk_prob``) and multiplied by
``routed_scaling_factor``. Shared experts are one dense SwiGLU every token passes through.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_tt_host.models.deepseek_v3.config import RoutedExpertsConfig
from vllm_tt_host.models.frame.checkpoint import MlpWeights
from vllm_tt_host.models.frame.mlp import gated_mlp
from vllm_tt_host.models.frame.moe import combine_experts


@dataclass(frozen=True)
class RoutedExperts:
    router: torch.Tensor
    """``[experts, hidden]`` (``mlp.gate.weight``)."""
    correction_bias: torch.Tensor
    """``[experts]`` (``mlp.gate.e_score_correction_bias``): added for the choice only."""
    experts: tuple[MlpWeights, ...]
    shared: MlpWeights | None
    """The shared experts as one MLP (``n_shared_experts x moe_intermediate_size`` wide)."""


def route(x: torch.Tensor, w: RoutedExperts, cfg: RoutedExpertsConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts of each token of ``x [T, hidden]`` and their weights, both ``[T, top_k]``."""
    scores = F.linear(x.float(), w.router.float()).sigmoid()
    choice = scores + w.correction_bias
    tokens = x.shape[0]
    per_group = cfg.num_experts // cfg.n_group
    group_scores = choice.view(tokens, cfg.n_group, per_group).topk(2, dim=-1).values.sum(-1)
    groups = group_scores.topk(cfg.topk_group, dim=-1).indices
    allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    allowed = allowed[:, :, None].expand(-1, -1, per_group).reshape(tokens, cfg.num_experts)
    experts = choice.masked_fill(~allowed, float("-inf")).topk(cfg.top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if cfg.norm_topk_prob:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return experts, weights * cfg.routed_scaling_factor


def routed_moe(x: torch.Tensor, w: RoutedExperts, cfg: RoutedExpertsConfig) -> torch.Tensor:
    """The routed experts' weighted sum plus the shared experts, for each token of ``x``."""
    experts, weights = route(x, w, cfg)
    out = combine_experts(x, experts, weights, lambda expert, h: gated_mlp(h, w.experts[expert]))
    return out if w.shared is None else out + gated_mlp(x, w.shared)
