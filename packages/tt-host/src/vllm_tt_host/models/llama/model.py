"""The Llama-style classes: they differ only in how ``DecoderConfig.read`` reads their config,
so each class just names its family. Every one also runs as an embedding model (``--runner
pooling``: ``DecoderPooling``); Qwen 3 also as a reranker (``HostQwen3ForSequenceClassification``)."""

from __future__ import annotations

from typing import Any, ClassVar

from vllm_tt_host.models.frame.eagle3 import Eagle3Serving
from vllm_tt_host.models.frame.family import EAGLE3, MIXED, SELF_DRAFTING
from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.models.frame.pooling import DecoderPooling, HostDecoderClassifier


class _LlamaStyleLM(Eagle3Serving, DecoderPooling, HostCausalLM):
    model_capabilities: ClassVar[dict[str, Any]] = {
        **HostCausalLM.model_capabilities, **SELF_DRAFTING, **MIXED, **EAGLE3, "supports_pooling": True,
    }


class HostLlamaForCausalLM(_LlamaStyleLM):
    """Llama 2/3.x: default or llama3 rope, optional attention/MLP bias."""

    family = "llama"


class HostMistralForCausalLM(_LlamaStyleLM):
    """Mistral without a sliding window (v0.2 and later); a window is refused at load."""

    family = "mistral"


class HostQwen2ForCausalLM(_LlamaStyleLM):
    """Qwen 2 / 2.5: bias on the q, k and v projections."""

    family = "qwen2"


class HostQwen3ForCausalLM(_LlamaStyleLM):
    """Qwen 3 (dense): per-head RMSNorm on q and k before rotation."""

    family = "qwen3"


class HostQwen3ForSequenceClassification(HostDecoderClassifier):
    """Qwen 3 as a reranker (Qwen3-Reranker through vLLM's ``--hf-overrides`` recipe): the
    ``yes - no`` row of the LM head read at the last token."""

    causal_lm = HostQwen3ForCausalLM
