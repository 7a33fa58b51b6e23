"""What the runner does with a pooling model's output, on the host, per request: an embedding
model's hidden states are pooled by vLLM's pooler config (CLS, MEAN or LAST token) and the
request's ``PoolingParams`` (``dimensions``, then normalisation when ``use_activation``), as
vLLM's embedding pooler does; a model with its own head (``pooled_outputs``) gets vLLM's own
classification activation (sigmoid for one label, softmax for more, or the checkpoint's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from vllm_tt_platform.errors import TTUnsupportedFeatureError

SEQ_POOLING = ("CLS", "MEAN", "LAST")


@dataclass(frozen=True)
class SequencePooler:
    """Embeddings: ``[prompt_len, H]`` hidden states to one vector."""

    kind: str
    """CLS, MEAN or LAST."""
    tasks = ("embed",)

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


class ClassifierHead:
    """Classification (cross-encoder scores): the model's ``[D]`` logits through vLLM's
    activation for the checkpoint (``get_act_fn``: problem type, sentence-transformers'
    activation, else sigmoid for one label and softmax for more)."""

    tasks = ("classify",)

    def __init__(self, model_config: Any) -> None:
        from vllm.model_executor.layers.pooler.activations import get_act_fn

        self.kind = "model head"
        self.activation = get_act_fn(model_config.hf_config)

    def pool(self, logits: torch.Tensor, params: Any) -> torch.Tensor:
        if getattr(params, "use_activation", True) is not False:
            logits = self.activation(logits)
        return logits.to(torch.float32).contiguous()
