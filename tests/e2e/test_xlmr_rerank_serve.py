"""An XLM-R cross-encoder reranker (``XLMRobertaForSequenceClassification``, one label:
bge-reranker-v2-m3's shape) through ``vllm serve --runner pooling`` on the host mesh backend:
``/score`` and ``/rerank`` give transformers' sigmoid relevance scores within 1e-5, in the same
ranking, for a query against 8 documents of different lengths in one batched request."""

from __future__ import annotations

import pytest
import torch
from vllm_tt_testing.tiny_bert import hf_scores, inputs_of_lengths, tiny_xlmr_cross_encoder

from tests.e2e.helpers import serve
from tests.e2e.pooling_checks import (
    TINY_BERT_ARGS,
    assert_same_ranking,
    assert_scores_spread,
    served_ranking,
    served_scores,
)

pytestmark = pytest.mark.e2e

QUERY = "the fog in the low fields"
MODEL = "tiny-xlmr-reranker"
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_xlmr_cross_encoder()


@pytest.fixture(scope="module")
def documents():
    return inputs_of_lengths(8, growth=5)


@pytest.fixture(scope="module")
def reference(checkpoint, documents):
    return hf_scores(checkpoint, QUERY, documents)


@pytest.fixture(scope="module")
def url(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("xlmr-rerank-serve") / "serve.log"
    with serve(checkpoint, *TINY_BERT_ARGS, "--served-model-name", MODEL, log=log) as base:
        yield base


def test_scores_spread(reference):
    assert_scores_spread(reference, TOLERANCE)


def test_score_equals_transformers(url, documents, reference):
    torch.testing.assert_close(served_scores(url, MODEL, QUERY, documents), reference, atol=TOLERANCE, rtol=0)


def test_rerank_keeps_the_ranking(url, documents, reference):
    ranked, got = served_ranking(url, MODEL, QUERY, documents)
    assert_same_ranking(ranked, reference, TOLERANCE)
    torch.testing.assert_close(got, reference[ranked], atol=TOLERANCE, rtol=0)
