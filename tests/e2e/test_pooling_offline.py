"""A pooling model through ``vllm.LLM(..., runner="pooling").embed()`` on the host mesh backend,
with vLLM's pooler config asking for MEAN pooling (the serve test covers the model's default,
CLS): vectors equal transformers' for 16 inputs of 4 to 126 tokens, alone and batched, with the
default shapes (up to --max-model-len); ``.score()`` (vLLM's bi-encoder score: the cosine of
the two vectors) equals the cosine of transformers' vectors, in the same ranking; a generation
call is refused by name; an XLM-R embedding checkpoint embeds as transformers' does."""

from __future__ import annotations

import pytest
import torch
from vllm_tt_testing.tiny_bert import hf_embeddings, inputs_of_lengths, tiny_bert

from tests.e2e.helpers import offline_llm

pytestmark = pytest.mark.e2e

COSINE = 0.99999


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_bert()


@pytest.fixture(scope="module")
def texts():
    return inputs_of_lengths(16)


@pytest.fixture(scope="module")
def llm(checkpoint):
    return offline_llm(model=str(checkpoint), runner="pooling", max_model_len=128, seed=0,
                       pooler_config={"seq_pooling_type": "MEAN"},
                       additional_config={"tt": {"mesh_backend": "host"}})


def _cosines(outputs, want) -> list[float]:
    got = torch.tensor([o.outputs.embedding for o in outputs])
    return torch.nn.functional.cosine_similarity(got, want, dim=-1).tolist()


def test_batched_equals_transformers(llm, checkpoint, texts):
    cosines = _cosines(llm.embed(texts), hf_embeddings(checkpoint, texts, pooling="MEAN"))
    assert min(cosines) >= COSINE, cosines


def test_alone_equals_transformers(llm, checkpoint, texts):
    want = hf_embeddings(checkpoint, texts, pooling="MEAN")
    cosines = [c for i, t in enumerate(texts) for c in _cosines(llm.embed([t]), want[i:i + 1])]
    assert min(cosines) >= COSINE, cosines


def test_mean_is_not_cls(llm, checkpoint, texts):
    """The pooler config reached the runner: CLS vectors would not match."""
    cosines = _cosines(llm.embed(texts[5:6]), hf_embeddings(checkpoint, texts[5:6], pooling="CLS"))
    assert cosines[0] < 0.999


SCORE_TOLERANCE = 1e-5
"""The cosine of two unit vectors each within ``COSINE`` of transformers' (float32)."""


def test_score_is_the_cosine_of_transformers_vectors(llm, checkpoint, texts):
    want = hf_embeddings(checkpoint, texts, pooling="MEAN")
    expected = want[1:] @ want[0]
    got = torch.tensor([o.outputs.score for o in llm.score(texts[0], texts[1:])])
    torch.testing.assert_close(got, expected, atol=SCORE_TOLERANCE, rtol=0)
    gaps = expected.sort().values.diff()
    assert gaps.min().item() > 2 * SCORE_TOLERANCE, expected.tolist()  # a ranking worth comparing
    assert got.argsort().tolist() == expected.argsort().tolist()


def test_generate_is_refused(llm):
    with pytest.raises(ValueError, match="pooling model|generat"):
        llm.generate(["hello"])


def test_an_xlmr_encoder_embeds_as_transformers():
    """An XLM-R embedding checkpoint (bge-m3's dense vectors at tiny size: XLM-R positions from
    ``pad_token_id + 1``, one token type), with the architecture's default CLS pooling, for 16
    inputs (shorter ones: XLM-R's tokenizer cuts them finer)."""
    from vllm_tt_testing.tiny_bert import tiny_xlmr

    checkpoint, texts = tiny_xlmr(), inputs_of_lengths(16, growth=3)
    llm = offline_llm(model=str(checkpoint), runner="pooling", max_model_len=128, seed=0,
                      additional_config={"tt": {"mesh_backend": "host"}})
    cosines = _cosines(llm.embed(texts), hf_embeddings(checkpoint, texts))
    assert min(cosines) >= COSINE, cosines
