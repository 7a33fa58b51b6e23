"""Sequence pooling of a pooling model's hidden states, on the host: vLLM's pooler config (CLS,
MEAN or LAST token) and the request's ``PoolingParams`` (``dimensions``, then normalisation
when ``use_activation``), as vLLM's embedding pooler applies them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_tt_platform.errors import TTUnsupportedFeatureError

SEQ_POOLING = ("CLS", "MEAN", "LAST")
TASKS: tuple[str, ...] = ("embed",)
"""The pooling tasks the TT runner serves (vLLM's ``PoolingTask`` names)."""


@dataclass(frozen=True)
class SequencePooler:
    kind: str
    """CLS, MEAN or LAST."""

    @classmethod
    def of(cls, model_config: Any) -> SequencePooler:
        pooler = model_config.pooler_config
        kind = None if pooler is None else getattr(pooler, "seq_pooling_type", None)
        if kind not in SEQ_POOLING:
            raise TTUnsupportedFeatureError(
                "--pooler-config seq_pooling_type", kind, ", ".join(SEQ_POOLING),
                'pass --pooler-config \'{"seq_pooling_type": "CLS"}\' (or MEAN, LAST)',
            )
        return cls(kind)

    def pool(self, hidden: torch.Tensor, params: Any) -> torch.Tensor:
        """One request's vector from its ``[prompt_len, H]`` hidden states."""
        if self.kind == "CLS":
            vector = hidden[0]
        elif self.kind == "LAST":
            vector = hidden[-1]
        else:
            vector = hidden.mean(dim=0)
        dimensions = getattr(params, "dimensions", None)
        if dimensions is not None:
            vector = vector[:dimensions]
        if getattr(params, "use_activation", True) is not False:
            vector = torch.nn.functional.normalize(vector, p=2, dim=-1)
        return vector.to(torch.float32).contiguous()
