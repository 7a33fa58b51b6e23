"""DeepSeek V3 end to end: the engine on the host backend generates what transformers'
generate() does on the tiny DeepSeek V3 (latent attention, a dense layer then routed + shared
experts, YaRN). vLLM sees ``model_config.use_mla`` on and plans one MLA KV cache group (one
latent per token); it asks the platform for no attention backend, since the TT worker builds
none of vLLM's attention layers. Offline through ``vllm.LLM`` (prompts split into prefill
chunks, several at once, a block pool small enough that vLLM preempts and recomputes), and
through ``vllm serve`` as 4 in-process lanes on an emulated Galaxy."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import assert_greedy_equal, concurrent_greedy, hf_greedy, offline_llm, serve

pytestmark = pytest.mark.e2e

ROWS = 4
"""Decode rows (per lane with lanes)."""
LANES = 4
TRAIN_STEPS = 120
"""The recipe packages/tt-host/tests/test_host_deepseek_v3.py builds (one build a session)."""
CHUNK = 64
"""``max_num_batched_tokens``: prompts longer than this are prefilled in several chunks."""


@pytest.fixture(scope="module")
def deepseek_dir() -> Path:
    return cached_tiny("deepseek_v3", TRAIN_STEPS)


def test_offline_greedy_matches_transformers_in_chunks_and_under_preemption(deepseek_dir):
    """Six prompts (40-150 tokens, up to three chunks) at once on 4 rows, 20 blocks of 32
    tokens for requests that each grow past 100 tokens: vLLM preempts and later recomputes
    requests, and every output is still transformers'."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(21)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (40, 150, 65, 130, 90, 5)]
    llm = offline_llm(
        model=str(deepseek_dir), max_num_seqs=ROWS, max_model_len=256, seed=0, block_size=32,
        num_gpu_blocks_override=20, max_num_batched_tokens=CHUNK, enable_prefix_caching=False,
        disable_log_stats=False, additional_config={"tt": {"mesh_backend": "host"}},
    )
    try:
        assert llm.llm_engine.model_config.use_mla
        params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        preemptions = sum(int(m.value) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    finally:
        del llm
    assert preemptions > 0
    got = [list(r.outputs[0].token_ids) for r in results]
    assert_greedy_equal(prompts, got, hf_greedy(deepseek_dir, prompts, 60))


def test_galaxy_lanes_serve_greedy_matches_transformers(deepseek_dir, tmp_path):
    """``--data-parallel-size 4`` on TG (8x4) -> 4 lanes of 4 rows in one engine, each lane
    with its own latent cache; all prompts at once, so every lane runs several."""
    rng = random.Random(22)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (5, 31, 64, 65, 100, 150, 17, 90)]
    expected = hf_greedy(deepseek_dir, prompts, 16)
    log = tmp_path / "serve.log"
    args = ("--served-model-name", "tiny", "--data-parallel-size", str(LANES), "--max-num-seqs", str(ROWS),
            "--api-server-count", "1", "--max-model-len", "512")
    with serve(deepseek_dir, *args, env={"MESH_DEVICE": "TG"}, log=log, timeout=600) as url:
        got = concurrent_greedy(url, prompts, 16)
    assert_greedy_equal(prompts, got, expected)
    text = log.read_text()
    assert f"{LANES} lanes x {ROWS} rows" in text and "groups: mla layers [0, 1]" in text
