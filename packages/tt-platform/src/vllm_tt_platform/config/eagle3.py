"""An EAGLE-3 head as ``--speculative-config method eagle3`` names it, read once from vLLM's draft
config, for the startup checks and the runner's drafter.

vLLM wraps the head's config in its ``EAGLEConfig`` (the head's own fields copied onto it). The
target layers the head reads are vLLM's rule: ``eagle_aux_hidden_state_layer_ids`` on the config
or in its ``eagle_config``, else the target's default ``(2, L // 2, L - 3)`` for ``L`` layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Eagle3HeadConfig:
    """What the TT platform reads of an EAGLE-3 head's config."""

    folder: str
    aux_layer_ids: tuple[int, ...]
    """The target layers whose entering residual stream the head reads, in ``fc``'s order."""
    num_layers: int
    hidden_size: int
    target_hidden_size: int
    """The hidden size of the states ``fc`` reads (the target's)."""
    vocab_size: int
    """The target vocabulary the head's drafts are ids of."""
    draft_vocab_size: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, draft_model_config: Any, target_layers: int) -> Eagle3HeadConfig:
        hf = draft_model_config.hf_config
        eagle = getattr(hf, "eagle_config", None) or {}
        ids = getattr(hf, "eagle_aux_hidden_state_layer_ids", None) or eagle.get("eagle_aux_hidden_state_layer_ids")
        if not ids:
            ids = (2, target_layers // 2, target_layers - 3)
        hidden = int(hf.hidden_size)
        heads = int(hf.num_attention_heads)
        return cls(
            folder=str(draft_model_config.model), aux_layer_ids=tuple(int(i) for i in ids),
            num_layers=int(hf.num_hidden_layers), hidden_size=hidden,
            target_hidden_size=int(getattr(hf, "target_hidden_size", None) or hidden),
            vocab_size=int(hf.vocab_size), draft_vocab_size=int(getattr(hf, "draft_vocab_size", None) or hf.vocab_size),
            num_kv_heads=int(getattr(hf, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(hf, "head_dim", None) or hidden // heads),
        )
