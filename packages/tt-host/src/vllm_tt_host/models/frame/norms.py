"""RMSNorm, the one normalisation every host decoder and most vision towers use.

The order of operations is transformers' (``weight * (x * rsqrt(mean(x^2) + eps))`` in float32),
so that greedy decoding matches it token for token. Families whose norm scales by ``1 + w``
pass ``1 + w`` as the weight.
"""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))
