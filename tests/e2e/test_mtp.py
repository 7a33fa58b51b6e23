"""Speculative decoding with the checkpoint's own MTP module (``method: mtp``, issue 31), one
engine start per family: the tiny DeepSeek V3 with a trained MTP module (``cached_mtp``) and the
tiny Qwen 3.5 with a trained ``mtp.*`` module (``tiny_mtp.cached_qwen3_5_mtp``, vLLM's
``qwen3_5_mtp``); transformers drops those weights, the host model runs them on the mesh inside
the model. Qwen 3.5 is recurrent-hybrid: its delta-net layers keep ``1 + K`` state slots per
request (one per verify position), so a rejected draft never reaches the state the next step
starts from.

Greedy outputs equal transformers' target outputs alone and 24 requests at once (more than
rows and KV blocks: rows queue and are preempted with drafts in flight) while the module's
drafts are accepted and rejected; ``max_tokens``, stop tokens and EOS are exact; sampled
continuations keep the target's distribution (the chi-square check the n-gram tests use).
Bad configurations fail at startup naming the setting (tests/test_validation.py; a checkpoint
without MTP weights: tt-host's test_host_mtp and test_host_qwen3_5).
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

K = 2
MAX_NEW_TOKENS = 24
KV_BLOCKS = {"deepseek_v3": 9, "qwen3_5": 24}
"""Per family, a block pool small enough that rows queue for blocks and some are preempted
(Qwen 3.5's requests also hold 3 x (1 + K) state blocks)."""


def _checkpoint(family: str):
    from vllm_tt_testing.checkpoints import cached_mtp
    from vllm_tt_testing.tiny_mtp import cached_qwen3_5_mtp

    return cached_mtp() if family == "deepseek_v3" else cached_qwen3_5_mtp()


@pytest.fixture(scope="module", params=["deepseek_v3", "qwen3_5"])
def engine(request):
    family = request.param
    model_dir = _checkpoint(family)
    model_type = json.loads((model_dir / "config.json").read_text())["model_type"]
    assert model_type == {"deepseek_v3": "deepseek_v3", "qwen3_5": "qwen3_5_text"}[family]  # the family proven
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=4, max_model_len=256, seed=0, block_size=32,
        speculative_config={"method": "mtp", "num_speculative_tokens": K},
        num_gpu_blocks_override=KV_BLOCKS[family], disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def test_greedy_equals_transformers_alone_and_24_concurrent(engine):
    model_dir, llm = engine
    assert_greedy_exact_alone_and_concurrent(llm, model_dir, MAX_NEW_TOKENS, preempts=True)


def test_max_tokens_stop_tokens_and_eos_are_exact(engine):
    """Accepted drafts never run past ``max_tokens``, a stop token or EOS (the trained tiny
    model ends corpus-like text with its EOS)."""
    model_dir, llm = engine
    assert_max_tokens_stop_tokens_and_eos_exact(llm, model_dir, MAX_NEW_TOKENS)


def test_sampled_continuations_keep_the_target_distribution(engine):
    """The shared chi-square check with the module's greedy drafts (unseeded and seeded). The
    trained tiny models' top-4 at temperature 0.5 and 0.625 differ too little for 400
    samples (DeepSeek V3: expected chi-square excess ~30-50 over 255 degrees of freedom), so the power
    check against the hotter distribution is the untrained llama tests' to make."""
    model_dir, llm = engine
    prompt = repetitive_prompts(llm.get_tokenizer().vocab_size)[0]
    assert_keeps_target_distribution(llm, model_dir, prompt, acceptance_range=(0.05, 0.99), tells_hotter_apart=False)
