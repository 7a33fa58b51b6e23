"""Cross-encoders and classifiers through ``vllm.LLM(..., runner="pooling")`` on the host mesh
backend (the serve tests cover ``/score``, ``/rerank`` and ``/classify``): ``LLM.score()`` of a
query against 16 documents of different lengths equals transformers' sigmoid relevance scores
in the same ranking (the pairs' token types reach the model), and ``LLM.classify()`` of 16
texts equals transformers' softmax label probabilities."""

from __future__ import annotations

import pytest
import torch
from vllm_tt_testing.tiny_bert import (
    hf_class_probs,
    hf_scores,
    inputs_of_lengths,
    tiny_classifier,
    tiny_cross_encoder,
)

from tests.e2e.helpers import offline_llm
from tests.e2e.pooling_checks import assert_same_ranking

pytestmark = pytest.mark.e2e

QUERY = "the fog in the low fields"
TOLERANCE = 5e-5
"""As the serve tests': padded batches sum in another order than transformers' one at a time."""
TEXTS = inputs_of_lengths(16, growth=3)


def pooling_llm(checkpoint):
    return offline_llm(model=str(checkpoint), runner="pooling", max_model_len=128, max_num_seqs=8, seed=0,
                       additional_config={"tt": {"mesh_backend": "host"}})


def test_score_of_a_cross_encoder_equals_transformers():
    checkpoint = tiny_cross_encoder()
    reference = hf_scores(checkpoint, QUERY, TEXTS)
    llm = pooling_llm(checkpoint)
    got = torch.tensor([o.outputs.score for o in llm.score(QUERY, TEXTS)])
    torch.testing.assert_close(got, reference, atol=TOLERANCE, rtol=0)
    assert_same_ranking(torch.argsort(got, descending=True).tolist(), reference, TOLERANCE)


def test_classify_equals_transformers_probabilities():
    checkpoint = tiny_classifier()
    reference = hf_class_probs(checkpoint, TEXTS)
    llm = pooling_llm(checkpoint)
    got = torch.tensor([o.outputs.probs for o in llm.classify(TEXTS)])
    assert got.shape == reference.shape == (16, 3)
    torch.testing.assert_close(got, reference, atol=TOLERANCE, rtol=0)
