"""``HostBertModel``: a BERT-style encoder served as a TT pooling model (``pool_forward``).

Bidirectional attention over each row's real tokens (padding keys masked), learned absolute
positions, post-norm layers: the math of transformers' ``BertModel`` and ``XLMRobertaModel``
(which differ only in where positions start and in the classification head's names), returning
the last hidden states; the runner pools them. Programs run at the fixed (batch, length) shapes warmup captured,
as traces do on a device: a traced call at any other shape is an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch.nn import functional as F

from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.bert.config import EncoderConfig
from vllm_tt_host.models.bert.weights import (
    BERT_HEAD,
    ROBERTA_HEAD,
    CheckpointTensors,
    ClassifierWeights,
    EncoderWeights,
    HeadLayout,
    Norm,
    load_classifier_weights,
    load_encoder_weights,
)
from vllm_tt_host.models.frame.checkpoint import resolve_checkpoint_dir
from vllm_tt_host.models.frame.shapes import HostModelInputError, TraceKey
from vllm_tt_host.models.frame.vllm_surface import VllmInspectionSurface


class HostBertModel(VllmInspectionSurface):
    """transformers' ``BertModel`` (bge-large's shape) on the host mesh."""

    model_capabilities: ClassVar[dict[str, Any]] = {"pooling_model": True}
    # What vLLM's class inspection reads for a pooling architecture (bge pools the CLS token).
    is_pooling_model: ClassVar[bool] = True
    default_seq_pooling_type: ClassVar[str] = "CLS"
    attn_type: ClassVar[str] = "encoder_only"

    def __init__(self, config: EncoderConfig, weights: EncoderWeights, mesh_device: HostMeshDevice,
                 head: ClassifierWeights | None = None, vllm_config: Any = None) -> None:
        """Built by ``initialize_vllm_model``; ``vllm_config`` is named only for vLLM's class inspection."""
        if vllm_config is not None:
            raise TypeError(f"{type(self).__name__} is built by initialize_vllm_model(), not by vLLM's loader")
        self.config = config
        self.weights = weights
        self.head = head
        self.mesh_device = mesh_device

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: HostMeshDevice, max_batch_size: int,
                              max_seq_len: int, tt_data_parallel: int = 1, optimizations: str | None = None,
                              ) -> HostBertModel:
        config = EncoderConfig.from_hf(hf_config)
        if max_seq_len > config.max_length:
            raise HostModelInputError(
                f"max_seq_len {max_seq_len} exceeds the {config.max_length} positions of the encoder's "
                f"max_position_embeddings {config.max_positions}; serve with --max-model-len "
                f"{config.max_length} or less"
            )
        tensors = CheckpointTensors(resolve_checkpoint_dir(getattr(hf_config, "_name_or_path", "")))
        return cls(config, load_encoder_weights(tensors, config), mesh_device, head=cls._head(tensors))

    @classmethod
    def _head(cls, tensors: CheckpointTensors) -> ClassifierWeights | None:
        """The weights on top of the encoder (none: the hidden states are the output)."""
        return None

    def warmup_model_pool(self, shapes: Sequence[tuple[int, int]], enable_trace: bool) -> None:
        """Run every ``(batch, length)`` program once; with ``enable_trace``, capture its trace."""
        for batch, length in shapes:
            tokens = torch.full((batch, length), self.config.pad_token_id, dtype=torch.int64)
            self._encode(tokens, torch.full((batch,), length, dtype=torch.int64), None)
            if enable_trace:
                self.mesh_device.capture_trace(TraceKey.pool(batch, length))

    def pool_forward(self, tokens: Any, prompt_lens: Any, enable_trace: bool = False,
                     token_type_ids: Any = None, **kwargs: Any) -> torch.Tensor:
        tokens = torch.as_tensor(tokens, dtype=torch.int64)
        lens = torch.as_tensor(prompt_lens, dtype=torch.int64)
        batch, length = tokens.shape
        if length > self.config.max_length:
            raise HostModelInputError(
                f"pool_forward of length {length} is longer than the encoder's {self.config.max_length} positions"
            )
        if enable_trace:
            self.mesh_device.replay_trace(TraceKey.pool(batch, length))
        hidden = self._encode(tokens, lens, token_type_ids)
        if self.head is None:
            return hidden
        # BERT's pooler then classifier, XLM-R's classification head: both out(tanh(dense(first token))).
        return self.head.out(torch.tanh(self.head.dense(hidden[:, 0])))

    @torch.inference_mode()
    def _encode(self, tokens: torch.Tensor, lens: torch.Tensor, token_type_ids: Any) -> torch.Tensor:
        cfg, w = self.config, self.weights
        batch, length = tokens.shape
        # XLM-R has one token type: its tokenizer sends none, and a pair's second text reads type 0 too.
        one_type = token_type_ids is None or cfg.type_vocab_size == 1
        types = torch.zeros_like(tokens) if one_type else torch.as_tensor(token_type_ids).long()
        positions = w.position[cfg.position_offset: cfg.position_offset + length]
        x = w.word[tokens] + positions[None] + w.token_type[types]
        x = _norm(x, w.embed_norm, cfg.layer_norm_eps)
        real = torch.arange(length)[None, :] < lens[:, None]  # [B, L] keys that are prompt tokens
        mask = torch.zeros(batch, 1, 1, length).masked_fill(~real[:, None, None, :], torch.finfo(torch.float32).min)
        heads, dim = cfg.num_heads, cfg.head_dim
        for layer in w.layers:
            def split(t: torch.Tensor) -> torch.Tensor:
                return t.view(batch, length, heads, dim).transpose(1, 2)

            q, k, v = split(layer.query(x)), split(layer.key(x)), split(layer.value(x))
            scores = q @ k.transpose(-1, -2) / math.sqrt(dim) + mask
            context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, cfg.hidden_size)
            x = _norm(x + layer.attn_out(context), layer.attn_norm, cfg.layer_norm_eps)
            x = _norm(x + layer.down(F.gelu(layer.up(x))), layer.out_norm, cfg.layer_norm_eps)
        return x


class HostBertForSequenceClassification(HostBertModel):
    """transformers' ``BertForSequenceClassification`` (a cross-encoder reranker, bge-reranker's
    shape with a BERT encoder): ``pool_forward`` returns the classifier's logits ``[B, labels]``."""

    model_capabilities: ClassVar[dict[str, Any]] = {"pooling_model": True, "pooled_outputs": True}
    head_layout: ClassVar[HeadLayout] = BERT_HEAD

    @classmethod
    def _head(cls, tensors: CheckpointTensors) -> ClassifierWeights | None:
        return load_classifier_weights(tensors, cls.head_layout)


class HostXLMRobertaModel(HostBertModel):
    """transformers' ``XLMRobertaModel`` (bge-m3's encoder): BERT's math, positions from
    ``pad_token_id + 1`` (read from the config)."""


class HostXLMRobertaForSequenceClassification(HostBertForSequenceClassification):
    """transformers' ``XLMRobertaForSequenceClassification`` (bge-reranker-v2-m3's shape): the
    XLM-R encoder, then its classification head on the first token; logits ``[B, labels]``."""

    head_layout: ClassVar[HeadLayout] = ROBERTA_HEAD


def _norm(x: torch.Tensor, norm: Norm, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, eps)
