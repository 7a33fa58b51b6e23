"""Llama-style dense decoders: Llama 2/3.x, Mistral (no sliding window), Qwen 2 / 2.5 and Qwen 3.

They share every layer of the frame's ``HostDecoder``; ``DecoderConfig.read`` reads which
projections carry a bias and whether q/k are normed per head, so a class only names its family.
Each also serves embeddings (``--runner pooling``), and Qwen 3 reranking (vLLM's
Qwen3-Reranker recipe: ``TTQwen3ForSequenceClassification``)."""

from __future__ import annotations

from vllm_tt_host.models.frame.family import DECODER, EAGLE3, MIXED, SELF_DRAFTING, HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTLlamaForCausalLM": "model:HostLlamaForCausalLM",
        "TTMistralForCausalLM": "model:HostMistralForCausalLM",
        "TTQwen2ForCausalLM": "model:HostQwen2ForCausalLM",
        "TTQwen3ForCausalLM": "model:HostQwen3ForCausalLM",
        "TTQwen3ForSequenceClassification": "model:HostQwen3ForSequenceClassification",
    },
    tiny=("llama", "mistral", "qwen2", "qwen3"),
    capabilities={
        **dict.fromkeys(("TTLlamaForCausalLM", "TTMistralForCausalLM", "TTQwen2ForCausalLM", "TTQwen3ForCausalLM"),
                        {**DECODER, **SELF_DRAFTING, **MIXED, **EAGLE3, "supports_pooling": True}),
        "TTQwen3ForSequenceClassification": {"pooling_model": True, "pooled_outputs": True},
    },
)
