"""A causal LM served as a reranker through vLLM's score path (Qwen3-Reranker's documented
recipe: ``--runner pooling --hf-overrides '{"architectures": ["Qwen3ForSequenceClassification"],
"classifier_from_token": [false, true], "is_original_qwen3_reranker": true}'``) on the host mesh
backend: ``/score`` and ``/rerank`` give transformers' ``sigmoid(logit[true] - logit[false])`` at
the last token for a query against 16 documents of different lengths, in the same ranking,
batched and one pair per request."""

from __future__ import annotations

import json

import httpx
import pytest
import torch
from vllm_tt_testing.checkpoints import cached_tiny
from vllm_tt_testing.decoder_pooling import hf_reranker_scores, reranker_overrides
from vllm_tt_testing.tiny_bert import inputs_of_lengths

from tests.e2e.helpers import serve
from tests.e2e.pooling_checks import assert_same_ranking, assert_scores_spread

pytestmark = pytest.mark.e2e

QUERY = "a morning of rain"
TOLERANCE = 1e-5
MODEL = "tiny-qwen3-reranker"


@pytest.fixture(scope="module")
def checkpoint():
    return cached_tiny("qwen3")


@pytest.fixture(scope="module")
def documents():
    return inputs_of_lengths(16, growth=3)


@pytest.fixture(scope="module")
def reference(checkpoint, documents):
    return hf_reranker_scores(checkpoint, QUERY, documents)


@pytest.fixture(scope="module")
def url(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("decoder-rerank-serve") / "serve.log"
    with serve(checkpoint, "--runner", "pooling", "--hf-overrides", json.dumps(reranker_overrides()),
               "--served-model-name", MODEL, "--max-model-len", "256", "--max-num-seqs", "8", log=log) as base:
        yield base


def test_scores_spread(reference):
    assert_scores_spread(reference, TOLERANCE)


def test_score_equals_transformers(url, documents, reference):
    body = httpx.post(f"{url}/score", json={"model": MODEL, "queries": QUERY, "documents": documents},
                      timeout=120).json()
    got = torch.tensor([d["score"] for d in sorted(body["data"], key=lambda d: d["index"])])
    torch.testing.assert_close(got, reference, atol=TOLERANCE, rtol=0)


def test_rerank_keeps_the_ranking(url, documents, reference):
    body = httpx.post(f"{url}/rerank", json={"model": MODEL, "query": QUERY, "documents": documents},
                      timeout=120).json()
    ranked = [r["index"] for r in body["results"]]
    assert_same_ranking(ranked, reference, TOLERANCE)
    got = torch.tensor([r["relevance_score"] for r in body["results"]])
    torch.testing.assert_close(got, reference[ranked], atol=TOLERANCE, rtol=0)


def test_each_pair_alone_equals_transformers(url, documents, reference):
    got = [httpx.post(f"{url}/score", json={"model": MODEL, "queries": QUERY, "documents": d},
                      timeout=60).json()["data"][0]["score"] for d in documents[:6]]
    torch.testing.assert_close(torch.tensor(got), reference[:6], atol=TOLERANCE, rtol=0)
