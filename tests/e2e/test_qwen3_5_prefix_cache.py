"""Prefix caching for Qwen 3.5 (``TTQwen3_5ForCausalLM``: gated delta-net layers over a recurrent
state, a gated full-attention layer) through ``vllm.LLM``, vLLM's default: its hybrid ``align``
cache mode keeps a delta-net state block per 64-token block, the scheduler ends prefill chunks
on block boundaries, and the TT runner has the model read each step's state from the block of
its first token's predecessor and write it to the block of its last token. A repeated long
prompt, a later turn of the same conversation and a prompt sharing another's prefix start from
the cached state (vLLM's prefix-cache hit counters and ``num_cached_tokens`` say so) and equal
transformers token for token. A second engine offloads to host memory (``--kv-offloading-size``):
prompts evicted from a small device pool come back from the host, delta-net states included."""

from __future__ import annotations

import random

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import greedy_one_by_one, hf_greedy, metric_total, offline_llm

pytestmark = pytest.mark.e2e

BLOCK = 64
CHUNK = 128
"""``max_num_batched_tokens``: a 258-token prompt runs in chunks ending at 128, 256 and 258."""
MAX_NEW_TOKENS = 24
TRAIN_STEPS = 100
"""The recipe packages/tt-host/tests/test_host_qwen3_5.py builds (one build a session)."""


@pytest.fixture(scope="module")
def engine():
    model_dir = cached_tiny("qwen3_5", TRAIN_STEPS)
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=2, max_model_len=512, seed=0, max_num_batched_tokens=CHUNK,
        disable_log_stats=False, additional_config={"tt": {"mesh_backend": "host"}},
    )
    yield model_dir, llm
    del llm


def _one_by_one(llm, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    return greedy_one_by_one(llm, prompts, MAX_NEW_TOKENS)


def _hits(llm) -> int:
    return metric_total(llm, "vllm:prefix_cache_hits")


def test_a_repeated_long_prompt_and_a_later_turn_start_from_the_cached_state(engine):
    """The 258-token prompt again hits its 4 full blocks (the state after 256 tokens, left by
    the chunk that ended there) and computes 2; the next turn (prompt, answer, new text) hits
    them too; both equal transformers, as does the first, uncached run. The suffixes after the
    hits are short: the tiny model's delta-net states decay within a few dozen tokens, so only
    tokens right after the boundary show a wrong starting state."""
    model_dir, llm = engine
    cache = llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching and cache.mamba_cache_mode == "align"
    assert (cache.block_size, cache.mamba_block_size) == (BLOCK, BLOCK)
    rng = random.Random(3)
    prompt = [rng.randrange(3, 1000) for _ in range(4 * BLOCK + 2)]
    before = _hits(llm)
    first, again = _one_by_one(llm, [prompt, prompt])
    turn = prompt + first[0] + [rng.randrange(3, 1000) for _ in range(3)]
    (later, later_cached), = _one_by_one(llm, [turn])
    assert (first[1], again[1], later_cached) == (0, 4 * BLOCK, 4 * BLOCK)
    assert _hits(llm) - before >= 8 * BLOCK
    expected = hf_greedy(model_dir, [prompt, turn], MAX_NEW_TOKENS)
    assert first[0] == again[0] == expected[0]
    assert later == expected[1]


def test_a_shared_prefix_with_another_suffix_equals_transformers(engine):
    """Two prompts sharing 194 tokens: vLLM stops the first's prefill at its last block
    boundary (192), so the second starts from that state and computes only its last 5."""
    model_dir, llm = engine
    rng = random.Random(4)
    shared = [rng.randrange(3, 1000) for _ in range(3 * BLOCK + 2)]
    prompts = [shared + [rng.randrange(3, 1000) for _ in range(n)] for n in (1, 3)]
    results = _one_by_one(llm, prompts)
    assert [cached for _, cached in results] == [0, 3 * BLOCK]
    assert [tokens for tokens, _ in results] == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)


def test_evicted_prefixes_come_back_from_host_memory_with_their_states():
    """Three 258-token prompts through a 16-block device pool, then again: every second-round
    hit (4 blocks: attention KV and the 256-token delta-net states) is loaded from host memory,
    none is left on the device, and the 2 tokens computed after it equal transformers."""
    model_dir = cached_tiny("qwen3_5", TRAIN_STEPS)
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=2, max_model_len=512, seed=0, max_num_batched_tokens=CHUNK,
        num_gpu_blocks_override=16, kv_offloading_size=0.01, disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    try:
        rng = random.Random(5)
        prompts = [[rng.randrange(3, 1000) for _ in range(4 * BLOCK + 2)] for _ in range(3)]
        first = _one_by_one(llm, prompts)
        stored = metric_total(llm, "vllm:kv_offload_store_bytes")
        second = _one_by_one(llm, prompts)
        loaded = (metric_total(llm, "vllm:external_prefix_cache_hits"), metric_total(llm, "vllm:kv_offload_load_bytes"))
        local = _hits(llm)
    finally:
        del llm
    assert stored > 0
    assert [cached for _, cached in first + second] == [0] * 3 + [4 * BLOCK] * 3
    assert loaded[0] == 3 * 4 * BLOCK and loaded[1] > 0 and local == 0
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    assert [tokens for tokens, _ in first] == expected
    assert [tokens for tokens, _ in second] == expected
