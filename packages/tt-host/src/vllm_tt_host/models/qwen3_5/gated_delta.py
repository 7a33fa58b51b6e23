"""The gated delta rule and its per-request state, in plain torch.

A gated delta-net layer keeps, per request, a fixed-size state instead of a growing KV cache: the
last ``kernel - 1`` inputs of its causal convolution and one ``[k_dim, v_dim]`` matrix per value
head. The state of a request lives in one block of the layer's state pool (``RecurrentState``),
the block vLLM's hybrid KV manager assigned to the request in the layer's KV cache group
(``MambaSpec``): the runner passes it as entry 0 of that group's page-table row. Every step
reads the state, advances it over the step's tokens and writes it back, so a chunked prefill
continues exactly where the last chunk stopped; a prefill from position 0 starts from zeros
(the block may hold another request's old state).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

L2_NORM_EPS = 1e-6
"""transformers' (and flash-linear-attention's) epsilon of the q/k L2 normalisation."""


@dataclass(frozen=True)
class RecurrentState:
    """One layer's state pool, indexed by block id."""

    conv: torch.Tensor
    """``[num_blocks, conv_dim, kernel - 1]``: the newest convolution inputs, oldest first."""
    recurrent: torch.Tensor
    """``[num_blocks, v_heads, k_dim, v_dim]``."""

    @classmethod
    def zeros(cls, num_blocks: int, conv_shape: tuple[int, int], recurrent_shape: tuple[int, int, int]) -> RecurrentState:
        return cls(torch.zeros(num_blocks, *conv_shape), torch.zeros(num_blocks, *recurrent_shape))

    @property
    def num_blocks(self) -> int:
        return self.conv.shape[0]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The block-indexed tensors, for copies to and from host memory (``BlockStates``)."""
        return self.conv, self.recurrent

    def read(self, blocks: torch.Tensor, fresh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The states of ``blocks [B]``; rows where ``fresh [B]`` is set start from zeros."""
        keep = (~fresh).to(self.conv.dtype)
        return self.conv[blocks] * keep[:, None, None], self.recurrent[blocks] * keep[:, None, None, None]

    def write(self, blocks: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        self.conv[blocks] = conv
        self.recurrent[blocks] = recurrent


def causal_conv(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution with SiLU of ``x [B, T, C]`` after the previous inputs
    ``window [B, C, K - 1]`` (``weight [C, K]``); returns ``[B, T, C]`` and the new window."""
    joined = torch.cat((window, x.transpose(1, 2)), dim=-1)
    out = F.conv1d(joined, weight[:, None, :], groups=weight.shape[0])
    return F.silu(out).transpose(1, 2), joined[..., joined.shape[-1] - window.shape[-1] :]


def l2_normalize(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_NORM_EPS)


def gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_decay: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token over ``T``: ``S <- exp(g) S``, then ``S <- S + k (beta (v - S^T k))^T``
    and the output ``S^T q``. ``q, k [B, T, H, dk]`` (normalised, q scaled), ``v [B, T, H, dv]``,
    ``log_decay, beta [B, T, H]``, ``state [B, H, dk, dv]``; returns ``[B, T, H, dv]`` and the
    final state."""
    out = torch.empty_like(v)
    for t in range(q.shape[1]):
        state = state * log_decay[:, t].exp()[..., None, None]
        k_t = k[:, t]
        remembered = (state * k_t[..., None]).sum(dim=-2)
        delta = (v[:, t] - remembered) * beta[:, t, :, None]
        state = state + k_t[..., None] * delta[..., None, :]
        out[:, t] = (state * q[:, t, :, :, None]).sum(dim=-2)
    return out, state
