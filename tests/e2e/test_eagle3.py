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

from tests.e2e.helpers import offline_llm, repetitive_prompts
from tests.e2e.spec_checks import (
    assert_greedy_exact_alone_and_concurrent,
    assert_keeps_target_distribution,
    assert_max_tokens_stop_tokens_and_eos_exact,
)

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24


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
    model_dir, llm = engine
    assert_greedy_exact_alone_and_concurrent(llm, model_dir, MAX_NEW_TOKENS)


def test_max_tokens_stop_tokens_and_eos_are_exact(engine):
    model_dir, llm = engine
    assert_max_tokens_stop_tokens_and_eos_exact(llm, model_dir, MAX_NEW_TOKENS)


def test_sampled_continuations_keep_the_target_distribution(engine):
    """The shared chi-square check with the head's greedy drafts (unseeded and seeded)."""
    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    assert_keeps_target_distribution(llm, model_dir, prompt, acceptance_range=(0.05, 0.99), tells_hotter_apart=False)
