"""``EncoderConfig``: the fields of a Hugging Face BERT config the host encoder reads, checked once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_tt_platform.errors import TTConfigError

SERVED_ACTIVATIONS = ("gelu",)
"""``hidden_act`` values served (transformers' exact erf GELU, as BERT and bge use)."""


@dataclass(frozen=True)
class EncoderConfig:
    """A BERT encoder's dimensions."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_positions: int
    type_vocab_size: int
    layer_norm_eps: float
    pad_token_id: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

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
        return cls(
            vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
            intermediate_size=hf_config.intermediate_size, max_positions=hf_config.max_position_embeddings,
            type_vocab_size=getattr(hf_config, "type_vocab_size", 2), layer_norm_eps=hf_config.layer_norm_eps,
            pad_token_id=getattr(hf_config, "pad_token_id", 0) or 0,
        )
