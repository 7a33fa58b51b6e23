"""GPT-OSS end to end: the engine on the host backend generates what transformers' generate()
does on the tiny GPT-OSS (a sliding layer of window 32, a full layer, routed experts, sinks,
YaRN), for prompts shorter and longer than the window. vLLM's hybrid KV manager keeps one block
table per layer kind and frees blocks that left the window; the model reads each layer through
its own table. Offline through ``vllm.LLM`` on one mesh, and through ``vllm serve`` as 4
in-process lanes on an emulated Galaxy (``vllm.LLM`` refuses ``data_parallel_size > 1``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import assert_greedy_equal, concurrent_greedy, hf_greedy, offline_llm, serve

pytestmark = pytest.mark.e2e

MAX_NEW_TOKENS = 16
ROWS = 4
"""Decode rows (per lane with lanes)."""
LANES = 4
TRAIN_STEPS = 200
"""Trained briefly, so greedy margins are not ties (and eos is a likely token: ignored)."""


@pytest.fixture(scope="module")
def gpt_oss_dir() -> Path:
    return cached_tiny("gpt_oss", TRAIN_STEPS)


@pytest.fixture(scope="module")
def prompts_and_expected(gpt_oss_dir) -> tuple[list[list[int]], list[list[int]]]:
    """Lengths around the window (31-33), a few windows long, and past one 64-token block."""
    rng = random.Random(11)
    lengths = [5, 31, 32, 33, 47, 64, 65, 100, 150, 200, 17, 90]
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in lengths]
    return prompts, hf_greedy(gpt_oss_dir, prompts, MAX_NEW_TOKENS)


def test_offline_greedy_matches_transformers(gpt_oss_dir, prompts_and_expected):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts, expected = prompts_and_expected
    llm = offline_llm(
        model=str(gpt_oss_dir), max_num_seqs=ROWS, max_model_len=512, seed=0,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    del llm
    assert_greedy_equal(prompts, [list(r.outputs[0].token_ids) for r in results], expected)


def test_offline_greedy_matches_transformers_under_preemption(gpt_oss_dir):
    """20 blocks of 32 tokens for four requests that each grow to ~200 tokens: vLLM preempts and
    later recomputes requests (one prefill of prompt and generated tokens, past the window, with
    the sinks and routed experts), and every output is still transformers'."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(12)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (40, 50, 60, 70, 45, 55)]
    llm = offline_llm(
        model=str(gpt_oss_dir), max_num_seqs=ROWS, max_model_len=256, seed=0, block_size=32,
        num_gpu_blocks_override=20, enable_prefix_caching=False, disable_log_stats=False,
        additional_config={"tt": {"mesh_backend": "host"}},
    )
    try:
        params = SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        preemptions = sum(int(m.value) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    finally:
        del llm
    assert preemptions > 0
    assert_greedy_equal(prompts, [list(r.outputs[0].token_ids) for r in results], hf_greedy(gpt_oss_dir, prompts, 150))


def test_galaxy_lanes_serve_greedy_matches_transformers(gpt_oss_dir, prompts_and_expected, tmp_path):
    """``--data-parallel-size 4`` on TG (8x4) -> 4 lanes of 4 rows in one engine, each lane
    with its own hybrid KV cache; all prompts at once, so every lane runs several."""
    prompts, expected = prompts_and_expected
    log = tmp_path / "serve.log"
    args = ("--served-model-name", "tiny", "--data-parallel-size", str(LANES), "--max-num-seqs", str(ROWS),
            "--api-server-count", "1", "--max-model-len", "512")
    # A loaded 2-core machine takes minutes to start four lanes; the default wait is 240 s.
    with serve(gpt_oss_dir, *args, env={"MESH_DEVICE": "TG"}, log=log, timeout=600) as url:
        got = concurrent_greedy(url, prompts, MAX_NEW_TOKENS)
    assert_greedy_equal(prompts, got, expected)
    text = log.read_text()
    assert f"{LANES} lanes x {ROWS} rows" in text and "sliding(W=32) layers [0]; full layers [1]" in text
