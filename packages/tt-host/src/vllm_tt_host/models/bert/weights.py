"""The encoder's weights, read from a checkpoint folder's safetensors by their transformers names
(``BertModel`` saves them bare, ``BertFor*`` heads under ``bert.``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_tt_host.models.bert.config import EncoderConfig
from vllm_tt_host.models.checkpoint import CheckpointError

_PREFIXES = ("", "bert.")


@dataclass(frozen=True)
class Linear:
    weight: torch.Tensor
    bias: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight, self.bias)


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


def load_encoder_weights(folder: Path, config: EncoderConfig) -> EncoderWeights:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    prefix = next((p for p in _PREFIXES if f"{p}embeddings.word_embeddings.weight" in tensors), None)
    if prefix is None:
        raise CheckpointError(f"no BERT embeddings (embeddings.word_embeddings.weight) in the safetensors of {folder}")

    def get(name: str) -> torch.Tensor:
        full = prefix + name
        if full not in tensors:
            raise CheckpointError(f"tensor {full!r} is missing from the checkpoint in {folder}")
        return tensors[full].to(torch.float32).contiguous()

    def linear(name: str) -> Linear:
        return Linear(get(f"{name}.weight"), get(f"{name}.bias"))

    def norm(name: str) -> Norm:
        return Norm(get(f"{name}.weight"), get(f"{name}.bias"))

    layers = tuple(
        EncoderLayerWeights(
            query=linear(f"encoder.layer.{i}.attention.self.query"),
            key=linear(f"encoder.layer.{i}.attention.self.key"),
            value=linear(f"encoder.layer.{i}.attention.self.value"),
            attn_out=linear(f"encoder.layer.{i}.attention.output.dense"),
            attn_norm=norm(f"encoder.layer.{i}.attention.output.LayerNorm"),
            up=linear(f"encoder.layer.{i}.intermediate.dense"),
            down=linear(f"encoder.layer.{i}.output.dense"),
            out_norm=norm(f"encoder.layer.{i}.output.LayerNorm"),
        )
        for i in range(config.num_layers)
    )
    weights = EncoderWeights(
        word=get("embeddings.word_embeddings.weight"), position=get("embeddings.position_embeddings.weight"),
        token_type=get("embeddings.token_type_embeddings.weight"), embed_norm=norm("embeddings.LayerNorm"),
        layers=layers,
    )
    if tuple(weights.word.shape) != (config.vocab_size, config.hidden_size):
        raise CheckpointError(f"embeddings.word_embeddings.weight in {folder} is {tuple(weights.word.shape)}, "
                              f"config.json says ({config.vocab_size}, {config.hidden_size})")
    return weights
