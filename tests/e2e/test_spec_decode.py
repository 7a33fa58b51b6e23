"""Speculative decoding with n-gram drafts on the host backend (issue 19), one engine start.

The engine verifies vLLM's ``NgramProposer`` drafts in fixed-shape ``[rows, 1 + K]`` verify
steps; greedy outputs must equal transformers', token for token, however many drafts are
accepted, alone and with more requests than rows and KV blocks, under preemption with drafts in
flight, with ``max_tokens`` and stop tokens exact.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import assert_greedy_equal, hf_greedy, repetitive_prompts

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24
MAX_NUM_SEQS = 4


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    from vllm import LLM

    model_dir = tiny_checkpoint("llama")
    llm = LLM(
        model=str(model_dir), max_num_seqs=MAX_NUM_SEQS, max_model_len=256, seed=0,
        speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1},
        # a small KV pool (4 blocks of 64 tokens): admission waits for blocks, rows queue
        num_gpu_blocks_override=5, disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def _generate(llm, prompts, params):
    from vllm.inputs import TokensPrompt

    return [list(r.outputs[0].token_ids) for r in llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                                               params, use_tqdm=False)]


def test_greedy_equals_transformers_alone_and_concurrent(engine):
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    together = _generate(llm, prompts, params)  # more requests than rows and KV blocks: queueing
    alone = [_generate(llm, [p], params)[0] for p in prompts[:3]]
    assert together == expected
    assert alone == expected[:3]
    metrics = {m.name: m for m in llm.get_metrics()}
    drafts = metrics["vllm:spec_decode_num_draft_tokens"].value
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value
    assert drafts > 0 and 0 < accepted <= drafts, (drafts, accepted)


def _counter(llm, name: str) -> int:
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


def test_preemption_with_drafts_in_flight_stays_exact(engine):
    """Four rows that each grow to three KV blocks in a pool of four: vLLM preempts rows that
    carry drafts (their drafts dropped, their KV freed) and later recomputes them, and every
    output is still transformers'."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]  # 30-36 tokens: one block each
    max_tokens = 100
    expected = hf_greedy(model_dir, prompts, max_tokens)
    preempted = _counter(llm, "vllm:num_preemptions")
    accepted = _counter(llm, "vllm:spec_decode_num_accepted_tokens")
    got = _generate(llm, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    assert_greedy_equal(prompts, got, expected)
    assert _counter(llm, "vllm:num_preemptions") > preempted
    assert _counter(llm, "vllm:spec_decode_num_accepted_tokens") > accepted


def test_max_tokens_and_stop_are_exact(engine):
    """Drafts never run past max_tokens or a stop token: the output ends where the plain
    greedy continuation says it must."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    full = hf_greedy(model_dir, [prompt], MAX_NEW_TOKENS)[0]
    for n in (1, 2, 5):
        assert _generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0] == full[:n]
    stop = full[6]
    cut = full[: full.index(stop) + 1]
    got = _generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, stop_token_ids=[stop]))
    assert got[0] == cut


def test_sampled_and_logprob_requests_are_served(engine):
    """Sampled rows go through vLLM's rejection sampler; a logprobs request makes its batch
    run without drafts: neither is refused, and seeded sampling reproduces."""
    from vllm import SamplingParams

    _, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]
    sampled = _generate(llm, prompts, SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True))
    assert all(len(t) == 16 for t in sampled)
    seeded = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=7)
    assert _generate(llm, prompts[:2], seeded) == _generate(llm, prompts[:2], seeded)
    out = llm.generate([{"prompt_token_ids": prompts[0]}],
                       SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs) == 8
