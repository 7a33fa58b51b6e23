"""Gemma 4 with mixed page sizes through vLLM's engine on the host mesh backend: full layers of
two KV heads x 64 (128 values per token) beside sliding layers of 64, the shape of the real
checkpoints. vLLM's hybrid KV manager makes every page as large by doubling the sliding
groups' block size (64 tokens against the full group's 32); the runner allocates each layer in
its own block size over the shared tensors and each layer reads its own. Greedy outputs equal
transformers' generate() for prompts far past the window side by side, prefix-cache hits and
under KV pressure that forces preemption, on one engine."""

from __future__ import annotations

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import (
    assert_greedy_equal,
    hf_greedy,
    metric_total,
    offline_greedy,
    offline_llm,
    seeded_prompts,
)
from tests.e2e.test_gemma4_serve import BLOCKS, TRAIN_STEPS, WINDOW

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def checkpoint():
    """The ``gemma4_pages`` tiny recipe."""
    return cached_tiny("gemma4_pages", TRAIN_STEPS)


@pytest.fixture(scope="module")
def rounds(checkpoint):
    """One engine: its KV plan and layout, then (prompts, outputs, max_tokens) per round and
    the preemptions and prefix-cache hits each round caused."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to inspect it
        llm = offline_llm(
            model=str(checkpoint), block_size=32, seed=0, disable_log_stats=False, max_num_seqs=4,
            max_model_len=256, num_gpu_blocks_override=BLOCKS, additional_config={"tt": {"mesh_backend": "host"}},
        )
    try:
        core = llm.llm_engine.engine_core.engine_core
        results, counts = {}, {}
        prefix = seeded_prompts(9, [200])[0]
        for name, prompts, max_tokens in (
            ("side by side", seeded_prompts(1, [3, 31, 33, 64, 65, 100, 129, 150, 230]), 16),
            ("prefix", [prefix], 8),
            ("prefix hits", [prefix + tail for tail in seeded_prompts(2, [5, 40])], 16),
            ("preemption", seeded_prompts(3, [40, 50, 60, 70, 45, 55, 65, 75]), 150),
        ):
            before = {m: metric_total(llm, m) for m in ("vllm:num_preemptions", "vllm:prefix_cache_hits")}
            results[name] = (prompts, offline_greedy(llm, prompts, max_tokens), max_tokens)
            counts[name] = {m: metric_total(llm, m) - v for m, v in before.items()}
        yield core.scheduler.kv_cache_config, core.model_executor.driver_worker.worker.runner.kv.layout, results, counts
    finally:
        del llm


def test_vllm_gives_the_sliding_groups_twice_the_block_size(rounds):
    plan, layout, _, _ = rounds
    sizes = sorted((type(g.kv_cache_spec).__name__, g.kv_cache_spec.block_size) for g in plan.kv_cache_groups)
    assert sizes == [("FullAttentionSpec", 32)] + [("SlidingWindowSpec", 2 * 32)] * 3
    assert len({g.kv_cache_spec.page_size_bytes for g in plan.kv_cache_groups}) == 1
    assert layout.layers[2].shape[1:] == (2, 32, 64) and layout.layers[0].shape[1:] == (2, 64, 32)
    assert all(g.sliding_window == WINDOW for g in layout.groups if g.block_size == 64)
    assert layout.block_tokens() == "32 (full), 64 (sliding)"  # what the startup log says


@pytest.mark.parametrize("name", ["side by side", "prefix hits", "preemption"])
def test_greedy_matches_transformers(checkpoint, rounds, name):
    _, _, results, counts = rounds
    if name == "preemption":
        assert counts[name]["vllm:num_preemptions"] > 0, "the pool was big enough: nothing was preempted"
    if name == "prefix hits":
        assert counts[name]["vllm:prefix_cache_hits"] >= 2 * 128, "no prefix-cache hits past the window"
    prompts, got, max_tokens = results[name]
    assert_greedy_equal(prompts, got, hf_greedy(checkpoint, prompts, max_tokens))
