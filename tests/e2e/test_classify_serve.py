"""A sequence classifier with three labels (``BertForSequenceClassification``) through ``vllm serve
--runner pooling`` on the host mesh backend: ``/classify`` gives transformers' label
probabilities (vLLM's softmax over the model's logits) and the most likely label, for 16 inputs
of different lengths in one request and one input per request, 4 at once."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
import torch
from vllm_tt_testing.tiny_bert import hf_class_probs, inputs_of_lengths, tiny_classifier

from tests.e2e.helpers import serve
from tests.e2e.pooling_checks import TINY_BERT_ARGS

pytestmark = pytest.mark.e2e

LABELS = 3
TOLERANCE = 5e-5
"""float32 probabilities: the server's padded batches sum in another order than transformers'
(observed up to 1.25e-5 since the runner packs a step's rows by modelled time), with a margin of
about three, as for the reranker's scores."""


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_classifier()


@pytest.fixture(scope="module")
def texts():
    return inputs_of_lengths(16)


@pytest.fixture(scope="module")
def reference(checkpoint, texts):
    return hf_class_probs(checkpoint, texts)


@pytest.fixture(scope="module")
def url(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("classify-serve") / "serve.log"
    with serve(checkpoint, *TINY_BERT_ARGS, "--served-model-name", "tiny-classifier", log=log) as base:
        yield base


def classify(url: str, texts: list[str]) -> list[dict]:
    response = httpx.post(f"{url}/classify", json={"model": "tiny-classifier", "input": texts}, timeout=120)
    assert response.status_code == 200, response.text
    return sorted(response.json()["data"], key=lambda d: d["index"])


def test_the_labels_are_told_apart(reference):
    """Every input's best label wins by more than the tolerance, and not all inputs share one."""
    top2 = reference.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min().item() > 2 * TOLERANCE, reference.tolist()
    assert len(set(reference.argmax(dim=-1).tolist())) > 1, reference.tolist()


def test_batched_probabilities_equal_transformers(url, texts, reference):
    data = classify(url, texts)
    assert all(d["num_classes"] == LABELS for d in data)
    torch.testing.assert_close(torch.tensor([d["probs"] for d in data]), reference, atol=TOLERANCE, rtol=0)
    assert [d["label"] for d in data] == [f"LABEL_{i}" for i in reference.argmax(dim=-1).tolist()]


def test_one_input_per_request_at_once_equals_transformers(url, texts, reference):
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        data = list(pool.map(lambda text: classify(url, [text])[0], texts[:4]))
    torch.testing.assert_close(torch.tensor([d["probs"] for d in data]), reference[:4], atol=TOLERANCE, rtol=0)
