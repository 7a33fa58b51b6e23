"""``Linear``: a weight and its bias, as the towers and encoders store their projections and
LayerNorms (one pair type, so loaders read ``<name>.weight`` / ``<name>.bias`` once)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Linear:
    weight: torch.Tensor
    bias: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def layer_norm(self, x: torch.Tensor, eps: float) -> torch.Tensor:
        """LayerNorm over the last dimension with this pair as its scale and shift."""
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, eps)
