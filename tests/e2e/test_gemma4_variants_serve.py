"""The Gemma 4 variants beyond text through vLLM's engine on the host mesh backend: the E-series
(per-layer input embeddings, double-wide MLP in the KV-shared layers) and the mixture-of-experts
model (a routed block beside each dense MLP). For each, greedy outputs equal transformers'
generate() for requests side by side and under KV pressure that forces preemption (a preempted
request's per-layer inputs and routing are recomputed from its tokens), then ``vllm serve``
with concurrent OpenAI clients."""

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
from tests.e2e.test_gemma4_serve import BLOCKS, TRAIN_STEPS

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", params=["gemma4_e", "gemma4_moe"])
def checkpoint(request):
    """The tiny recipes packages/tt-host/tests/test_host_gemma4.py builds."""
    return cached_tiny(request.param, TRAIN_STEPS)


@pytest.fixture(scope="module")
def rounds(checkpoint):
    """One engine: (prompts, outputs, max_tokens) and the preemptions of each round."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = offline_llm(
            model=str(checkpoint), block_size=32, seed=0, disable_log_stats=False, max_num_seqs=4,
            max_model_len=256, num_gpu_blocks_override=BLOCKS, additional_config={"tt": {"mesh_backend": "host"}},
        )
    try:
        results, preempted = {}, {}
        for name, prompts, max_tokens in (
            ("side by side", seeded_prompts(1, [3, 31, 33, 100, 150, 230]), 16),
            ("preemption", seeded_prompts(3, [40, 50, 60, 70, 45, 55, 65, 75]), 150),
        ):
            before = metric_total(llm, "vllm:num_preemptions")
            results[name] = (prompts, offline_greedy(llm, prompts, max_tokens), max_tokens)
            preempted[name] = metric_total(llm, "vllm:num_preemptions") - before
        yield results, preempted
    finally:
        del llm


@pytest.mark.parametrize("name", ["side by side", "preemption"])
def test_greedy_matches_transformers(checkpoint, rounds, name):
    results, preempted = rounds
    if name == "preemption":
        assert preempted[name] > 0, "the pool was big enough: nothing was preempted"
    prompts, got, max_tokens = results[name]
    assert_greedy_equal(prompts, got, hf_greedy(checkpoint, prompts, max_tokens))


def test_serve_concurrent_clients_match_transformers(checkpoint):
    """``vllm serve`` + the OpenAI client, 12 requests at once on 4 decode rows."""
    prompts = seeded_prompts(4, [5 + 17 * i for i in range(12)])
    args = ("--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512", "--block-size", "32")
    with serve(checkpoint, *args) as url:
        got = concurrent_greedy(url, prompts, 16)
    assert_greedy_equal(prompts, got, hf_greedy(checkpoint, prompts, 16))
