"""Speculative decoding with an EAGLE-3 head (``method: eagle3``, issue 31), one engine start:
the trained tiny ``LlamaForCausalLM`` and a trained tiny EAGLE-3 head for it (``cached_eagle3``:
vLLM's ``llama_eagle3`` format, a draft vocabulary of 512 ids with ``d2t``), which the host
model runs on the mesh beside the target, reading the target's auxiliary hidden states kept
per slot.

Greedy outputs equal transformers' target outputs alone and 24 requests at once (more than
rows and KV blocks: rows queue and are preempted with drafts in flight) while the head's
drafts are accepted and rejected; ``max_tokens``, stop tokens and EOS are exact; sampled
continuations keep the target's distribution (the shared chi-square check). Bad
configurations fail at startup naming the setting (``tests/test_startup_checks_eagle3.py``).
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import assert_greedy_equal, hf_greedy, offline_llm, repetitive_prompts
from tests.e2e.spec_checks import assert_keeps_target_distribution, counter, generate, mixed_prompts

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24
DRAFTED = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


@pytest.fixture(scope="module")
def engine():
    from vllm_tt_testing.checkpoints import cached_eagle3

    model_dir, head_dir = cached_eagle3()
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "llama"  # the family proven
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=4, max_model_len=256, seed=0, block_size=32,
        speculative_config={"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": K},
        num_gpu_blocks_override=9, disable_log_stats=False,  # rows queue for blocks, some are preempted
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def test_greedy_equals_transformers_alone_and_24_concurrent(engine):
    from vllm import SamplingParams

    model_dir, llm = engine
    prompts = mixed_prompts(llm.get_tokenizer().vocab_size)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    drafted, accepted = counter(llm, DRAFTED), counter(llm, ACCEPTED)
    together = generate(llm, prompts, params)
    assert_greedy_equal(prompts, together, expected)
    drafted, accepted = counter(llm, DRAFTED) - drafted, counter(llm, ACCEPTED) - accepted
    assert 0 < accepted < drafted, (drafted, accepted)  # drafts accepted and rejected
    alone = [generate(llm, [p], params)[0] for p in prompts[-3:]]
    assert alone == expected[-3:]


def test_max_tokens_stop_tokens_and_eos_are_exact(engine):
    """Accepted drafts never run past ``max_tokens``, a stop token or EOS (the trained tiny
    model ends corpus-like text with its EOS)."""
    from vllm import SamplingParams

    model_dir, llm = engine
    tokenizer = llm.get_tokenizer()
    prompt = mixed_prompts(tokenizer.vocab_size)[10]
    full = hf_greedy(model_dir, [prompt], MAX_NEW_TOKENS)[0]
    for n in (1, 2, 5):
        assert generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))[0] == full[:n]
    stop = full[6]
    got = generate(llm, [prompt], SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, stop_token_ids=[stop]))
    assert got[0] == full[: full.index(stop) + 1]
    eos_prompts = [tokenizer.encode(t) for t in ("The scheduler", "A lane is", "Each trace")]
    untils = hf_greedy(model_dir, eos_prompts, 64)
    ended = [(p, full[: full.index(tokenizer.eos_token_id) + 1]) for p, full in zip(eos_prompts, untils, strict=True)
             if tokenizer.eos_token_id in full]
    assert ended, "precondition: the tiny model ends one of these prompts with EOS within 64 tokens"
    got = generate(llm, [p for p, _ in ended], SamplingParams(temperature=0.0, max_tokens=64))
    assert got == [cut for _, cut in ended]


def test_sampled_continuations_keep_the_target_distribution(engine):
    """The shared chi-square check with the head's greedy drafts (unseeded and seeded)."""
    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    assert_keeps_target_distribution(llm, model_dir, prompt, acceptance_range=(0.05, 0.99), tells_hotter_apart=False)
