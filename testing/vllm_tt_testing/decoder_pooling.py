"""Oracles for a decoder served as a pooling model (Qwen3-Embedding, Qwen3-Reranker shapes) on
the shared tiny Qwen 3 checkpoint (``cached_tiny("qwen3")``): transformers' own model of the
same folder gives the last token's normalised hidden state, and the reranker's relevance
``sigmoid(logit[true] - logit[false])`` at the last token, as Qwen3-Reranker's model card
computes it (the 2-way softmax vLLM's ``from_2_way_softmax`` conversion folds into one row)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

RERANK_TOKENS = ("Ġno", "Ġthe")
"""``classifier_from_token`` (false, true) for the tiny checkpoint: its corpus-trained vocabulary
has no ``yes``, so two tokens it has stand in for Qwen3-Reranker's ``no`` / ``yes``."""


def reranker_overrides(tokens: Sequence[str] = RERANK_TOKENS) -> dict[str, Any]:
    """vLLM's ``--hf-overrides`` for an original Qwen3-Reranker checkpoint (its documented recipe)."""
    return {"architectures": ["Qwen3ForSequenceClassification"], "classifier_from_token": list(tokens),
            "is_original_qwen3_reranker": True}


def hf_last_token_embeddings(folder: Path, texts: Sequence[str]) -> Any:
    """transformers' final hidden state at each text's last token, L2-normalised (``[n, hidden]``)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    rows = []
    with torch.inference_mode():
        for text in texts:
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, -1]
            rows.append(torch.nn.functional.normalize(hidden, p=2, dim=-1))
    return torch.stack(rows)


def pair_ids(tokenizer: Any, query: str, document: str) -> list[int]:
    """The tokens vLLM's score path sends a causal-LM reranker for a pair: the query's and the
    document's text joined with no separator (``use_sep_token`` off for an LLM-as-reranker),
    then tokenized as one text."""
    return tokenizer(query + document)["input_ids"]


def hf_reranker_scores(folder: Path, query: str, documents: Sequence[str],
                       tokens: Sequence[str] = RERANK_TOKENS) -> Any:
    """transformers' relevance of each ``(query, document)``: ``sigmoid(logit[true] -
    logit[false])`` at the last token (float32 ``[n]``)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    false_id, true_id = (tokenizer.convert_tokens_to_ids(t) for t in tokens)
    scores = []
    with torch.inference_mode():
        for document in documents:
            logits = model(torch.tensor([pair_ids(tokenizer, query, document)])).logits[0, -1]
            scores.append(torch.sigmoid(logits[true_id] - logits[false_id]))
    return torch.stack(scores)
