"""Gemma 4 text through vLLM's engine on the host mesh backend: sliding layers and full layers of
another head size and KV head count, and two KV-shared layers that vLLM's hybrid KV manager
never sees (they own no blocks; the runner gives them their target's storage and tables).
Greedy outputs equal transformers' generate() for prompts far longer than the window: a request
alone, many side by side, prefix-cache hits past the window and under KV pressure that forces
preemption, all on one engine; then ``vllm serve`` with 24 concurrent OpenAI clients."""

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
TRAIN_STEPS = 100
"""The recipe packages/tt-host/tests/test_host_gemma4.py builds: one build per session."""
BLOCKS = 40
"""KV blocks of 32 tokens (4 groups) for 4 rows of up to 256 tokens: one request needs up to
~15, so four long ones (the preemption round) do not fit at once."""


@pytest.fixture(scope="module")
def gemma4_checkpoint():
    return cached_tiny("gemma4", TRAIN_STEPS)


@pytest.fixture(scope="module")
def rounds(gemma4_checkpoint):
    """One engine: its KV plan, then (name, prompts, outputs, max_tokens) per round and the
    preemptions each round caused."""

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to inspect it
        llm = offline_llm(
            model=str(gemma4_checkpoint), block_size=32, seed=0, disable_log_stats=False, max_num_seqs=4,
            max_model_len=256, num_gpu_blocks_override=BLOCKS, additional_config={"tt": {"mesh_backend": "host"}},
        )
    try:
        core = llm.llm_engine.engine_core.engine_core
        plan = core.scheduler.kv_cache_config
        runner = core.model_executor.driver_worker.worker.runner
        results, preempted = {}, {}
        long_prefix = seeded_prompts(9, [200])[0]
        for name, prompts, max_tokens in (
            ("alone", seeded_prompts(0, [230]), 16),
            ("side by side", seeded_prompts(1, [3, 20, 31, 32, 33, 64, 100, 129, 150, 180, 200, 230]), 16),
            ("prefix", [long_prefix], 16),
            ("prefix hits", [long_prefix + tail for tail in seeded_prompts(2, [5, 20, 35])], 16),
            ("preemption", seeded_prompts(3, [40, 50, 60, 70, 45, 55, 65, 75]), 150),
        ):
            before, hits = metric_total(llm, "vllm:num_preemptions"), metric_total(llm, "vllm:prefix_cache_hits")
            results[name] = (prompts, offline_greedy(llm, prompts, max_tokens), max_tokens)
            preempted[name] = metric_total(llm, "vllm:num_preemptions") - before
            preempted[name + " hits"] = metric_total(llm, "vllm:prefix_cache_hits") - hits
        yield plan, runner.kv.layout, results, preempted
    finally:
        del llm


def test_vllm_plans_only_the_layers_that_own_kv(rounds):
    plan, layout, _, _ = rounds
    planned = sorted(name for group in plan.kv_cache_groups for name in group.layer_names)
    assert planned == [f"model.layers.{i}.self_attn" for i in range(4)], planned
    kinds = sorted((type(g.kv_cache_spec).__name__, getattr(g.kv_cache_spec, "sliding_window", None))
                   for g in plan.kv_cache_groups)
    assert kinds == [("FullAttentionSpec", None)] + [("SlidingWindowSpec", WINDOW)] * 3
    assert dict(layout.shared) == {4: 3, 5: 2}
    assert layout.layers[4] == layout.layers[3] and layout.layers[5] == layout.layers[2]
    assert layout.layers[2].shape[1:] == (1, 32, 64) and layout.layers[0].shape[1:] == (2, 32, 32)


@pytest.mark.parametrize("name", ["alone", "side by side", "prefix", "prefix hits", "preemption"])
def test_greedy_matches_transformers(gemma4_checkpoint, rounds, name):
    _, _, results, preempted = rounds
    if name == "preemption":
        assert preempted[name] > 0, "the pool was big enough: nothing was preempted"
    if name == "prefix hits":
        assert preempted[name + " hits"] >= 3 * 192, "no prefix-cache hits past the window"
    prompts, got, max_tokens = results[name]
    assert_greedy_equal(prompts, got, hf_greedy(gemma4_checkpoint, prompts, max_tokens))


def test_serve_24_concurrent_clients_match_transformers(gemma4_checkpoint, tmp_path):
    """``vllm serve`` + the OpenAI client, 24 requests at once on 8 decode rows."""
    prompts = seeded_prompts(4, [5 + 13 * i for i in range(24)])
    log = tmp_path / "serve.log"
    args = ("--served-model-name", "tiny", "--max-num-seqs", "8", "--max-model-len", "512", "--block-size", "32")
    with serve(gemma4_checkpoint, *args, log=log) as url:
        got = concurrent_greedy(url, prompts, 16)
    assert_greedy_equal(prompts, got, hf_greedy(gemma4_checkpoint, prompts, 16))
    assert "layer 4 reads layer 3's KV; layer 5 reads layer 2's KV" in log.read_text()
