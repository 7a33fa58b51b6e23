"""Greedy parity: the vLLM engine on the host mesh backend generates exactly what
transformers' generate() does on the same checkpoint (float32)."""

from __future__ import annotations

import random
import re

import pytest

from tests.e2e.helpers import hf_greedy, offline_llm

pytestmark = pytest.mark.e2e

MAX_NEW_TOKENS = 12
MAX_NUM_SEQS = 4


def _prompts(vocab: int) -> list[list[int]]:
    """22 prompts from 3 to 300 tokens: several longer than one 128-token prefill bucket, and
    more prompts than decode rows so requests queue and join running batches."""
    rng = random.Random(1234)
    lengths = [3, 5, 8, 13, 21, 34, 55, 89, 100, 127, 128, 129, 140, 200, 255, 256, 300, 7, 17, 64, 96, 150]
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def engine(request, tiny_checkpoint):

    model_dir = tiny_checkpoint(request.param)
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=MAX_NUM_SEQS, max_model_len=512, seed=0,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def test_greedy_matches_transformers(engine):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    model_dir, llm = engine
    vocab = llm.get_tokenizer().vocab_size
    prompts = _prompts(vocab)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    got = [list(r.outputs[0].token_ids) for r in results]
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    mismatches = [(len(p), g, e) for p, g, e in zip(prompts, got, expected, strict=True) if g != e]
    assert not mismatches, f"{len(mismatches)} of {len(prompts)} prompts differ (len, vllm, hf): {mismatches[:3]}"


def test_text_prompts_and_chat(engine):
    from vllm import SamplingParams

    _, llm = engine
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0.0, max_tokens=8))
    assert len(out[0].outputs[0].token_ids) >= 1
    chat = llm.chat([{"role": "user", "content": "Say something."}], SamplingParams(temperature=0.0, max_tokens=8))
    assert len(chat[0].outputs[0].token_ids) >= 1


def test_repr_names_the_tt_model(engine):
    """``print(llm)`` asks the worker for the model tree; a TT model is named with its mesh."""
    _, llm = engine
    assert re.fullmatch(rf"Host\w+ \(TT model; mesh .+, 1 lane x {MAX_NUM_SEQS} rows\)", repr(llm)), repr(llm)
