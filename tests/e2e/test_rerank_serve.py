"""A cross-encoder reranker (``BertForSequenceClassification``, one label) through ``vllm serve
--runner pooling`` on the host mesh backend: ``/score`` and ``/rerank`` give transformers'
sigmoid relevance scores for a query against 16 documents of different lengths (the pair's
token types reach the model), in the same ranking, batched and one pair per request."""

from __future__ import annotations

import pytest
import torch
from vllm_tt_testing.tiny_bert import hf_scores, inputs_of_lengths, tiny_cross_encoder

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
TOLERANCE = 5e-5
"""float32: the server's padded batches sum in another order than transformers' one pair at a
time (observed up to 1.7e-5 on a score), with a margin of about three; scores of the random tiny
reranker closer than twice it are ties to the ranking check (``assert_same_ranking``)."""


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_cross_encoder()


@pytest.fixture(scope="module")
def documents():
    return inputs_of_lengths(16, growth=3)


@pytest.fixture(scope="module")
def reference(checkpoint, documents):
    return hf_scores(checkpoint, QUERY, documents)


@pytest.fixture(scope="module")
def url(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("rerank-serve") / "serve.log"
    with serve(checkpoint, *TINY_BERT_ARGS, "--served-model-name", "tiny-reranker", log=log) as base:
        yield base


def test_scores_spread(reference):
    assert_scores_spread(reference, TOLERANCE)


def test_score_equals_transformers(url, documents, reference):
    torch.testing.assert_close(served_scores(url, "tiny-reranker", QUERY, documents), reference,
                               atol=TOLERANCE, rtol=0)


def test_rerank_keeps_the_ranking(url, documents, reference):
    ranked, got = served_ranking(url, "tiny-reranker", QUERY, documents)
    assert_same_ranking(ranked, reference, TOLERANCE)
    torch.testing.assert_close(got, reference[ranked], atol=TOLERANCE, rtol=0)


def test_each_pair_alone_equals_transformers(url, documents, reference):
    got = torch.cat([served_scores(url, "tiny-reranker", QUERY, d) for d in documents[:6]])
    torch.testing.assert_close(got, reference[:6], atol=TOLERANCE, rtol=0)
