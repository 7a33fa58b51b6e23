"""What the pooling serve tests share: the tiny BERT server's options, the parity bound and its check."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import torch

TINY_BERT_ARGS = ("--runner", "pooling", "--max-model-len", "128", "--max-num-seqs", "8")
"""``vllm serve`` options of the tiny BERT checkpoints (``vllm_tt_testing.tiny_bert``: 128
positions) on the pooling runner."""

COSINE = 0.99999
"""Issue #32's bound: each served vector against transformers'."""


def assert_close(got: Any, want: torch.Tensor) -> None:
    """Every row of ``got`` (lists or arrays of floats) within ``COSINE`` of ``want``'s."""
    rows = torch.tensor(np.asarray(got, dtype=np.float32))
    cosine = torch.nn.functional.cosine_similarity(rows, want, dim=-1)
    assert cosine.min().item() >= COSINE, cosine.tolist()


def served_scores(url: str, model: str, query: str, documents: list[str] | str) -> torch.Tensor:
    """``/score`` of ``query`` against ``documents``, in request order."""
    body = httpx.post(f"{url}/score", json={"model": model, "queries": query, "documents": documents}, timeout=120)
    assert body.status_code == 200, body.text
    return torch.tensor([d["score"] for d in sorted(body.json()["data"], key=lambda d: d["index"])])


def served_ranking(url: str, model: str, query: str, documents: list[str]) -> tuple[list[int], torch.Tensor]:
    """``/rerank``'s document indices, best first, and their relevance scores."""
    body = httpx.post(f"{url}/rerank", json={"model": model, "query": query, "documents": documents}, timeout=120)
    assert body.status_code == 200, body.text
    results = body.json()["results"]
    return [r["index"] for r in results], torch.tensor([r["relevance_score"] for r in results])


def assert_scores_spread(reference: torch.Tensor, tolerance: float) -> None:
    """The oracle's scores span far more than the tolerance and most of them are apart by more
    than twice it, so a ranking check means something. A random tiny reranker may put two of
    its documents within the tolerance of each other (rebuilt checkpoints differ: one had two
    scores 3e-7 apart); those two form a tie that ``assert_same_ranking`` allows."""
    gaps = reference.sort().values.diff()
    assert (reference.max() - reference.min()).item() > 100 * tolerance, reference.tolist()
    assert (gaps > 2 * tolerance).sum().item() >= len(gaps) - 2, reference.tolist()


def assert_same_ranking(ranked: list[int], reference: torch.Tensor, tolerance: float) -> None:
    """``ranked`` (document indices, best first) is the oracle's order, except that documents
    whose scores are within twice the tolerance may come either way round."""
    assert sorted(ranked) == list(range(len(reference))), ranked
    scores = reference[ranked]
    assert bool((scores[1:] <= scores[:-1] + 2 * tolerance).all()), (ranked, reference.tolist())
