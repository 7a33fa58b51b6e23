"""``EncoderConfig``: the fields of a Hugging Face BERT or XLM-RoBERTa config the host encoder
reads, checked once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_tt_platform.errors import TTConfigError

SERVED_ACTIVATIONS = ("gelu",)
"""``hidden_act`` values served (transformers' exact erf GELU, as BERT and bge use)."""

ROBERTA_TYPES = ("xlm-roberta", "roberta")
"""``model_type`` values whose positions start past the padding index (transformers'
``create_position_ids_from_input_ids``: ``padding_idx + 1`` is the first real position)."""


@dataclass(frozen=True)
class EncoderConfig:
    """A BERT-style encoder's dimensions."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int
    position_offset: int
    """Row of the position table the first token reads: 0 for BERT, ``pad_token_id + 1`` for RoBERTa."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_length(self) -> int:
        """The longest input the position table covers."""
        return self.max_positions - self.position_offset

    @classmethod
    def from_hf(cls, hf_config: Any) -> EncoderConfig:
        """Read ``hf_config``; a variant the host math does not implement is refused by name."""
        position = getattr(hf_config, "position_embedding_type", "absolute")
        if position != "absolute":
            raise TTConfigError("config.json position_embedding_type", position, "absolute",
                                "serve a BERT checkpoint with absolute position embeddings")
        act = getattr(hf_config, "hidden_act", "gelu")
        if act not in SERVED_ACTIVATIONS:
            raise TTConfigError("config.json hidden_act", act, ", ".join(SERVED_ACTIVATIONS),
                                "serve a BERT checkpoint using the exact GELU")
        if hf_config.hidden_size % hf_config.num_attention_heads:
            raise TTConfigError("config.json num_attention_heads", hf_config.num_attention_heads,
                                f"a divisor of hidden_size {hf_config.hidden_size}", "fix config.json")
        pad = getattr(hf_config, "pad_token_id", 0) or 0
        return cls(
            vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
            intermediate_size=hf_config.intermediate_size, max_positions=hf_config.max_position_embeddings,
            type_vocab_size=getattr(hf_config, "type_vocab_size", 2), layer_norm_eps=hf_config.layer_norm_eps,
            pad_token_id=pad, position_offset=pad + 1 if hf_config.model_type in ROBERTA_TYPES else 0,
        )
