"""Speculative decoding with a drafter model (``method: draft_model``, issue 31), one engine
start: the tiny llama target, and a 1-layer drafter of the same family and tokenizer (the
target's own first layer, ``cached_drafter``) that runs as a second program on the host mesh.

Greedy outputs equal transformers' target outputs alone and 24 requests at once (more than
rows and KV blocks: rows queue and are preempted with drafts in flight), whatever the drafter
proposed; ``max_tokens`` and stop tokens are exact; sampled continuations keep the target's
distribution (the chi-square check the n-gram tests use) while drafts are accepted and
rejected; seeded rows draw the tokens they would draw without speculation.
"""

from __future__ import annotations

import pytest

from tests.e2e.helpers import assert_greedy_equal, hf_greedy, offline_llm, repetitive_prompts
from tests.e2e.spec_checks import (
    ACCEPTED,
    SAMPLED,
    assert_greedy_exact_alone_and_concurrent,
    assert_keeps_target_distribution,
    counter,
    counter_replay,
    generate,
    mixed_prompts,
)

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    from vllm_tt_testing.checkpoints import cached_drafter

    model_dir = tiny_checkpoint("llama")
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=4, max_model_len=256, seed=0,
        speculative_config={"method": "draft_model", "model": str(cached_drafter("llama")),
                            "num_speculative_tokens": K},
        # a small KV pool (4 blocks of 64 tokens): admission waits for blocks, rows queue
        num_gpu_blocks_override=5, disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def test_greedy_equals_transformers_alone_and_24_concurrent(engine):
    model_dir, llm = engine
    assert_greedy_exact_alone_and_concurrent(llm, model_dir, MAX_NEW_TOKENS)


def test_preemption_with_drafts_in_flight_stays_exact(engine):
    """Four rows that each grow to three KV blocks in a pool of four: vLLM preempts rows with
    drafts in flight (the drafter forgets them, their KV freed) and recomputes them later; the
    drafter prefills them again, and every output is still transformers'."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = repetitive_prompts(llm.get_tokenizer().vocab_size)[:4]
    max_tokens = 100
    expected = hf_greedy(model_dir, prompts, max_tokens)
    preempted, accepted = counter(llm, "vllm:num_preemptions"), counter(llm, ACCEPTED)
    got = generate(llm, prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    assert_greedy_equal(prompts, got, expected)
    assert counter(llm, "vllm:num_preemptions") > preempted
    assert counter(llm, ACCEPTED) > accepted


def test_max_tokens_and_stop_tokens_are_exact(engine):
    """Accepted drafts never run past ``max_tokens`` or a stop token (vLLM's per-token stop
    check, the one EOS goes through: the untrained tiny model never picks its EOS)."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompt = mixed_prompts(llm.get_tokenizer().vocab_size)[10]
    full = hf_greedy(model_dir, [prompt], MAX_NEW_TOKENS)[0]
    for n in (1, 2, 5):
        assert generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0] == full[:n]
    stop = full[6]
    cut = full[: full.index(stop) + 1]
    got = generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, stop_token_ids=[stop]))
    assert got[0] == cut


def test_seeded_sampling_keeps_its_tokens(engine):
    """A seeded row draws the tokens it would draw without speculation (transformers' logits
    replayed with the same counter-stream uniforms), alone and next to unseeded rows."""
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = mixed_prompts(llm.get_tokenizer().vocab_size)[:3]
    seeded = [SamplingParams(max_tokens=12, ignore_eos=True, seed=100 + i, **SAMPLED) for i in range(len(prompts))]
    neighbour = SamplingParams(max_tokens=12, ignore_eos=True, **SAMPLED)
    alone = [generate(llm, [p], s)[0] for p, s in zip(prompts, seeded, strict=True)]
    together = generate(llm, [*prompts, *prompts], [*seeded, *[neighbour] * len(prompts)])[: len(prompts)]
    assert together == alone
    assert alone == [counter_replay(model_dir, p, s.seed, 12) for p, s in zip(prompts, seeded, strict=True)]


def test_sampled_continuations_keep_the_target_distribution(engine):
    """The shared chi-square check with the drafter's greedy drafts: the target's top token has
    ~0.7 of the mass at ``SAMPLED``, so most drafts stand and the others are rejected."""
    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    assert_keeps_target_distribution(llm, model_dir, prompt, acceptance_range=(0.2, 0.95))
