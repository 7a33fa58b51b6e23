"""Speculative decoding with n-gram drafts on the host backend (issue 19), one engine start.

The engine verifies vLLM's ``NgramProposer`` drafts in fixed-shape ``[rows, 1 + K]`` verify
steps; greedy outputs must equal transformers', token for token, however many drafts are
accepted, alone and with more requests than rows and KV blocks, under preemption with drafts in
flight, with ``max_tokens`` and stop tokens exact. Seeded sampled rows take drafts and keep the
tokens of serving without them; sampled continuations keep the target distribution (chi-square
against transformers' exact probabilities) while drafts are accepted and rejected.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import assert_greedy_equal, hf_greedy, offline_llm, repetitive_prompts
from tests.e2e.spec_checks import (
    SAMPLED,
    assert_keeps_target_distribution,
    counter,
    counter_replay,
    generate,
    loop_prompt,
)

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24
MAX_NUM_SEQS = 4


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):

    model_dir = tiny_checkpoint("llama")
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=MAX_NUM_SEQS, max_model_len=256, seed=0,
        speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                            "prompt_lookup_min": 1},
        # a small KV pool (4 blocks of 64 tokens): admission waits for blocks, rows queue
        num_gpu_blocks_override=5, disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def test_greedy_equals_transformers_alone_and_concurrent(engine):
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    together = generate(llm, prompts, params)  # more requests than rows and KV blocks: queueing
    alone = [generate(llm, [p], params)[0] for p in prompts[:3]]
    assert together == expected
    assert alone == expected[:3]
    metrics = {m.name: m for m in llm.get_metrics()}
    drafts = metrics["vllm:spec_decode_num_draft_tokens"].value
    accepted = metrics["vllm:spec_decode_num_accepted_tokens"].value
    assert drafts > 0 and 0 < accepted <= drafts, (drafts, accepted)


def test_preemption_with_drafts_in_flight_stays_exact(engine):
    """Four rows that each grow to three KV blocks in a pool of four: vLLM preempts rows that
    carry drafts (their drafts dropped, their KV freed) and later recomputes them, and every
    output is still transformers'."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]  # 30-36 tokens: one block each
    max_tokens = 100
    expected = hf_greedy(model_dir, prompts, max_tokens)
    preempted = counter(llm, "vllm:num_preemptions")
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    got = generate(llm, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    assert_greedy_equal(prompts, got, expected)
    assert counter(llm, "vllm:num_preemptions") > preempted
    assert counter(llm, "vllm:spec_decode_num_accepted_tokens") > accepted


def test_max_tokens_and_stop_are_exact(engine):
    """Drafts never run past max_tokens or a stop token: the output ends where the plain
    greedy continuation says it must."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    full = hf_greedy(model_dir, [prompt], MAX_NEW_TOKENS)[0]
    for n in (1, 2, 5):
        assert generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0] == full[:n]
    stop = full[6]
    cut = full[: full.index(stop) + 1]
    got = generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, stop_token_ids=[stop]))
    assert got[0] == cut


def test_sampled_and_logprob_requests_are_served(engine):
    """Sampled rows go through vLLM's rejection sampler; a logprobs request makes its batch
    run without drafts: neither is refused, and seeded sampling reproduces."""
    from vllm import SamplingParams

    _, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]
    sampled = generate(llm, prompts, SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True))
    assert all(len(t) == 16 for t in sampled)
    seeded = SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True, seed=7)
    assert generate(llm, prompts[:2], seeded) == generate(llm, prompts[:2], seeded)
    out = llm.generate([{"prompt_token_ids": prompts[0]}],
                       SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, ignore_eos=True), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs) == 8



def test_seeded_sampling_takes_drafts_and_keeps_its_tokens(engine):
    """Seeded sampled rows take drafts: a draft stands while it equals the row's own
    counter-stream draw, so a seeded request gets the tokens it would get without speculation
    (transformers' logits replayed with the same uniforms), alone and next to other requests."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = [loop_prompt(model_dir, llm), *repetitive_prompts(llm.get_tokenizer().vocab_size)[1:3]]
    seeded = [SamplingParams(max_tokens=16, ignore_eos=True, seed=100 + i, **SAMPLED)
              for i in range(len(prompts))]
    neighbour = SamplingParams(max_tokens=16, ignore_eos=True, **SAMPLED)
    accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
    alone = [generate(llm, [p], s)[0] for p, s in zip(prompts, seeded, strict=True)]
    assert counter(llm, "vllm:spec_decode_num_accepted_tokens") > accepted  # seeded rows kept drafts
    together = generate(llm, [*prompts, *prompts], [*seeded, *[neighbour] * len(prompts)])[: len(prompts)]
    assert together == alone
    assert alone == [counter_replay(model_dir, p, s.seed, 16) for p, s in zip(prompts, seeded, strict=True)]


def test_sampled_continuations_keep_the_target_distribution(engine):
    """The shared chi-square check (``spec_checks.assert_keeps_target_distribution``) with
    n-gram drafts continuing the model's own loop."""
    model_dir, llm = engine
    assert_keeps_target_distribution(llm, model_dir, loop_prompt(model_dir, llm))
