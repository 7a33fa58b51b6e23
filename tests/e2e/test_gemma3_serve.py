"""Gemma 3 text through vLLM's engine on the host mesh backend: hybrid KV (one cache group per
layer kind, sliding-window blocks dropped by vLLM as the window moves on), greedy outputs equal
to transformers' generate() for prompts far longer than the window, with requests running
side by side and under KV pressure that forces preemption; and through ``vllm serve`` with
24 concurrent OpenAI clients."""

from __future__ import annotations

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import (
    assert_greedy_equal,
    concurrent_greedy,
    hf_greedy,
    metric_total,
    offline_greedy,
    offline_llm,
    seeded_prompts,
    serve,
)

pytestmark = pytest.mark.e2e

WINDOW = 32
"""The tiny recipe's sliding window; every prompt below but the first few crosses it."""


@pytest.fixture(scope="module")
def gemma3_checkpoint():
    """The tiny Gemma 3 (sliding, sliding, full), trained so that greedy margins are not ties;
    the folder the host model tests build (same recipe), so a session builds it once."""
    return cached_tiny("gemma3", 200)


def _llm(model_dir, tt: dict | None = None, **kwargs):

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to inspect it
        return offline_llm(
            model=str(model_dir), block_size=32, seed=0, disable_log_stats=False,
            additional_config={"tt": {"mesh_backend": "host", **(tt or {})}}, **kwargs,
        )


def _kv_groups(llm) -> list[tuple[str, int | None]]:
    config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
    return [
        (type(g.kv_cache_spec).__name__, getattr(g.kv_cache_spec, "sliding_window", None))
        for g in config.kv_cache_groups
    ]


def _preemptions(llm) -> int:
    return metric_total(llm, "vllm:num_preemptions")


def test_greedy_matches_transformers_past_the_window(gemma3_checkpoint):
    """12 prompts of 3-300 tokens on 4 decode rows: requests queue, join running batches and
    are prefilled in chunks; vLLM keeps a sliding-window group per sliding layer. Then prefix
    cache hits 200 tokens deep."""
    llm = _llm(gemma3_checkpoint, max_num_seqs=4, max_model_len=512)
    try:
        groups = _kv_groups(llm)
        assert ("SlidingWindowSpec", WINDOW) in groups and ("FullAttentionSpec", None) in groups, groups
        prompts = seeded_prompts(0, [3, 20, 31, 32, 33, 64, 100, 129, 150, 200, 255, 300])
        got = offline_greedy(llm, prompts, 16)
        assert _preemptions(llm) == 0
        # A second round that starts from a cached prefix far past the window: the prefill runs
        # from start_pos > 0 with the sliding groups' blocks before the window already null.
        shared = prompts[-1][:200]
        hit_prompts = [shared + tail for tail in seeded_prompts(2, [5, 40, 70])]
        before = metric_total(llm, "vllm:prefix_cache_hits")
        hit_got = offline_greedy(llm, hit_prompts, 16)
        assert metric_total(llm, "vllm:prefix_cache_hits") - before >= 3 * 128
    finally:
        del llm
    assert_greedy_equal(prompts, got, hf_greedy(gemma3_checkpoint, prompts, 16))
    assert_greedy_equal(hit_prompts, hit_got, hf_greedy(gemma3_checkpoint, hit_prompts, 16))


def test_greedy_matches_transformers_under_preemption(gemma3_checkpoint):
    """27 blocks of 32 tokens for four requests that each grow past 200 tokens: vLLM preempts
    and later recomputes requests (a prefill of prompt and generated tokens, far past the
    window), and outputs stay HF's."""
    llm = _llm(
        gemma3_checkpoint, max_num_seqs=4, max_model_len=256, num_gpu_blocks_override=27, enable_prefix_caching=False
    )
    try:
        prompts = seeded_prompts(1, [40, 50, 60, 70, 45, 55, 65, 75])
        got = offline_greedy(llm, prompts, 150)
        assert _preemptions(llm) > 0
    finally:
        del llm
    assert_greedy_equal(prompts, got, hf_greedy(gemma3_checkpoint, prompts, 150))


def test_greedy_matches_transformers_with_device_sampling_and_overlap(gemma3_checkpoint):
    """Device sampling with overlapped decode: the device keeps each slot's token and position
    and the runner submits a step before reading the last one back, page tables per layer
    included."""
    llm = _llm(gemma3_checkpoint, tt={"sample_on_device_mode": "all"}, max_num_seqs=4, max_model_len=512,
               async_scheduling=True)
    try:
        assert llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.runner.overlap.enabled
        prompts = seeded_prompts(3, [10, 40, 90, 150, 230, 300])
        got = offline_greedy(llm, prompts, 24)
    finally:
        del llm
    assert_greedy_equal(prompts, got, hf_greedy(gemma3_checkpoint, prompts, 24))


def test_serve_24_concurrent_clients_match_transformers(gemma3_checkpoint, tmp_path):
    """``vllm serve`` + the OpenAI client, 24 requests at once on 8 decode rows: requests queue,
    join running batches mid-flight and cross the window while others decode; each answer is
    transformers' greedy continuation."""
    prompts = seeded_prompts(4, [5 + 13 * i for i in range(24)])
    log = tmp_path / "serve.log"
    args = ("--served-model-name", "tiny", "--max-num-seqs", "8", "--max-model-len", "512", "--block-size", "32")
    with serve(gemma3_checkpoint, *args, log=log) as url:
        got = concurrent_greedy(url, prompts, 16)
    assert_greedy_equal(prompts, got, hf_greedy(gemma3_checkpoint, prompts, 16))
    assert "sliding(W=32)" in log.read_text()
