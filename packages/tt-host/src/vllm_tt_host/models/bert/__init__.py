"""BERT-style encoders on the host mesh: a pooling model family (bge-large / bge-m3 shape; BERT
and XLM-RoBERTa, bge-reranker-v2-m3's shape).

Self-contained: its config reading, weights and math live here; it shares with the decoder
families only the checkpoint-folder lookup and the trace emulation of the host device.
"""

from __future__ import annotations

from vllm_tt_host.models.frame.family import HostFamily

FAMILY = HostFamily(
    __name__,
    models={
        "TTBertModel": "model:HostBertModel",
        "TTBertForSequenceClassification": "model:HostBertForSequenceClassification",
        "TTXLMRobertaModel": "model:HostXLMRobertaModel",
        "TTXLMRobertaForSequenceClassification": "model:HostXLMRobertaForSequenceClassification",
    },
    tiny=("vllm_tt_testing.tiny_bert",),
    capabilities={
        "TTBertModel": {"pooling_model": True},
        "TTBertForSequenceClassification": {"pooling_model": True, "pooled_outputs": True},
        "TTXLMRobertaModel": {"pooling_model": True},
        "TTXLMRobertaForSequenceClassification": {"pooling_model": True, "pooled_outputs": True},
    },
)
