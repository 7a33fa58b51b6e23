"""The encoder's weights, read from a checkpoint folder's safetensors by their transformers names
(``BertModel`` and ``XLMRobertaModel`` save them bare, ``BertFor*`` heads under ``bert.``,
``XLMRobertaFor*`` heads under ``roberta.``: both encoders name their tensors alike)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_tt_host.models.bert.config import EncoderConfig
from vllm_tt_host.models.frame.checkpoint import CheckpointError, WeightFolder
from vllm_tt_host.models.frame.linear import Linear

_PREFIXES = ("", "bert.", "roberta.")


@dataclass(frozen=True)
class Norm:
    weight: torch.Tensor
    bias: torch.Tensor


@dataclass(frozen=True)
class EncoderLayerWeights:
    query: Linear
    key: Linear
    value: Linear
    attn_out: Linear
    attn_norm: Norm
    up: Linear
    down: Linear
    out_norm: Norm


@dataclass(frozen=True)
class EncoderWeights:
    word: torch.Tensor
    position: torch.Tensor
    token_type: torch.Tensor
    embed_norm: Norm
    layers: tuple[EncoderLayerWeights, ...]


@dataclass(frozen=True)
class ClassifierWeights:
    """A sequence classification head: ``out(tanh(dense(first token)))``."""

    dense: Linear
    out: Linear


@dataclass(frozen=True)
class HeadLayout:
    """Where a ``*ForSequenceClassification`` checkpoint saves its head's two layers."""

    dense: str
    dense_in_encoder: bool
    """The dense layer is saved under the encoder's prefix (BERT's pooler is part of ``BertModel``)."""
    out: str


BERT_HEAD = HeadLayout(dense="pooler.dense", dense_in_encoder=True, out="classifier")
"""``BertForSequenceClassification``: the encoder's pooler, then the classifier."""
ROBERTA_HEAD = HeadLayout(dense="classifier.dense", dense_in_encoder=False, out="classifier.out_proj")
"""``XLMRobertaForSequenceClassification``: its ``XLMRobertaClassificationHead`` (no pooler)."""


class CheckpointTensors:
    """A checkpoint folder's tensors by their ``BertModel`` names, whatever prefix it saved them
    under (the frame's ``WeightFolder`` reads the files)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._weights = WeightFolder(folder)
        self.prefix = self._weights.prefix(_PREFIXES, "embeddings.word_embeddings.weight", "BERT embeddings")

    def get(self, name: str, *, encoder: bool = True) -> torch.Tensor:
        """Tensor ``name``; ``encoder=False`` for a head's tensors, saved outside the prefix."""
        return self._weights.tensor(self.prefix + name if encoder else name)

    def linear(self, name: str, *, encoder: bool = True) -> Linear:
        return Linear(self.get(f"{name}.weight", encoder=encoder), self.get(f"{name}.bias", encoder=encoder))

    def norm(self, name: str) -> Norm:
        return Norm(self.get(f"{name}.weight"), self.get(f"{name}.bias"))


def load_encoder_weights(tensors: CheckpointTensors, config: EncoderConfig) -> EncoderWeights:
    layers = tuple(
        EncoderLayerWeights(
            query=tensors.linear(f"encoder.layer.{i}.attention.self.query"),
            key=tensors.linear(f"encoder.layer.{i}.attention.self.key"),
            value=tensors.linear(f"encoder.layer.{i}.attention.self.value"),
            attn_out=tensors.linear(f"encoder.layer.{i}.attention.output.dense"),
            attn_norm=tensors.norm(f"encoder.layer.{i}.attention.output.LayerNorm"),
            up=tensors.linear(f"encoder.layer.{i}.intermediate.dense"),
            down=tensors.linear(f"encoder.layer.{i}.output.dense"),
            out_norm=tensors.norm(f"encoder.layer.{i}.output.LayerNorm"),
        )
        for i in range(config.num_layers)
    )
    weights = EncoderWeights(
        word=tensors.get("embeddings.word_embeddings.weight"),
        position=tensors.get("embeddings.position_embeddings.weight"),
        token_type=tensors.get("embeddings.token_type_embeddings.weight"),
        embed_norm=tensors.norm("embeddings.LayerNorm"), layers=layers,
    )
    if tuple(weights.word.shape) != (config.vocab_size, config.hidden_size):
        raise CheckpointError(f"embeddings.word_embeddings.weight in {tensors.folder} is "
                              f"{tuple(weights.word.shape)}, config.json says ({config.vocab_size}, {config.hidden_size})")
    return weights


def load_classifier_weights(tensors: CheckpointTensors, layout: HeadLayout) -> ClassifierWeights:
    return ClassifierWeights(dense=tensors.linear(layout.dense, encoder=layout.dense_in_encoder),
                             out=tensors.linear(layout.out, encoder=False))
