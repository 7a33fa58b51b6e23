"""The gated MLP of the decoder layers: ``down(act(gate(x)) * up(x))``, SwiGLU by default
(Llama, Qwen, DeepSeek's dense and shared experts), GeGLU with a tanh GELU (Gemma)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from vllm_tt_host.models.frame.checkpoint import MlpWeights

gelu_tanh: Callable[[torch.Tensor], torch.Tensor] = functools.partial(F.gelu, approximate="tanh")


def gated_mlp(
    x: torch.Tensor, m: MlpWeights, activation: Callable[[torch.Tensor], torch.Tensor] = F.silu
) -> torch.Tensor:
    gate = activation(F.linear(x, m.gate, m.gate_bias))
    return F.linear(gate * F.linear(x, m.up, m.up_bias), m.down, m.down_bias)
