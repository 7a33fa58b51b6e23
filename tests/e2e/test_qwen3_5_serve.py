"""Qwen 3.5 text end to end: the engine on the host backend generates what transformers'
generate() does on the tiny Qwen 3.5 (three gated delta-net layers, then a gated full-attention
one). The worker hands vLLM one ``MambaSpec`` per delta-net layer and a ``FullAttentionSpec``
for the attention layer; vLLM's hybrid KV manager (prefix caching on by default: its ``align``
mode, a state block per 64 tokens) gives each request state blocks per delta-net group, of which
the runner sends the model the step's two (where the state comes from, where it goes). One
engine through ``vllm.LLM``: prompts prefilled in several chunks (the state continues across
them), several requests at once, a block pool small enough that vLLM preempts requests (they
resume from a cached state or from zeros); then ``vllm serve`` with concurrent OpenAI clients.
Prefix-cache hits themselves: tests/e2e/test_qwen3_5_prefix_cache.py."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import assert_greedy_equal, concurrent_greedy, hf_greedy, offline_llm, serve

pytestmark = pytest.mark.e2e

ROWS = 4
TRAIN_STEPS = 100
"""The recipe packages/tt-host/tests/test_host_qwen3_5.py builds (one build a session)."""
CHUNK = 64
"""``max_num_batched_tokens``: prompts longer than this are prefilled in several chunks."""


@pytest.fixture(scope="module")
def qwen3_5_dir() -> Path:
    return cached_tiny("qwen3_5", TRAIN_STEPS)


def test_offline_greedy_matches_transformers_in_chunks_and_under_preemption(qwen3_5_dir):
    """Seven prompts (2-190 tokens, up to four chunks) at once on 4 rows, 16 blocks of 32 tokens
    in the attention group for requests that each grow past 100 tokens: vLLM preempts and later
    recomputes requests, and every output is still transformers'."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    rng = random.Random(35)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (40, 190, 65, 130, 90, 2, 150)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to inspect it
        llm = offline_llm(
            model=str(qwen3_5_dir), max_num_seqs=ROWS, max_model_len=256, seed=0, block_size=32,
            num_gpu_blocks_override=24, max_num_batched_tokens=CHUNK, disable_log_stats=False,
            additional_config={"tt": {"mesh_backend": "host"}},
        )
    try:
        engine = llm.llm_engine
        assert engine.vllm_config.cache_config.enable_prefix_caching  # vLLM's default
        assert engine.vllm_config.cache_config.mamba_cache_mode == "align"
        groups = engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
        kinds = sorted(type(g.kv_cache_spec).__name__ for g in groups)
        assert kinds == [FullAttentionSpec.__name__] + [MambaSpec.__name__] * 3
        params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
        results = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        preemptions = sum(int(m.value) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
        alone = llm.generate([TokensPrompt(prompt_token_ids=prompts[1])], params, use_tqdm=False)
    finally:
        del llm
    assert preemptions > 0
    got = [list(r.outputs[0].token_ids) for r in results]
    expected = hf_greedy(qwen3_5_dir, prompts, 60)
    assert_greedy_equal(prompts, got, expected)
    assert list(alone[0].outputs[0].token_ids) == expected[1]


def test_serve_concurrent_clients_match_transformers(qwen3_5_dir, tmp_path):
    """``vllm serve`` (vLLM's defaults: prefix caching on) and eight clients at once on 4 rows. Prompts sharing 64-token chunks can
    leave one a last chunk of a single token, scheduled beside new prompts: a prefill row though
    its counts look like a decode's (this test once ended in MixedStepError that way;
    test_batch holds the deterministic case)."""
    rng = random.Random(36)
    prompts = [[rng.randrange(3, 1000) for _ in range(n)] for n in (5, 31, 64, 65, 100, 150, 17, 90)]
    expected = hf_greedy(qwen3_5_dir, prompts, 16)
    log = tmp_path / "serve.log"
    args = ("--served-model-name", "tiny", "--max-num-seqs", str(ROWS), "--max-model-len", "512",
            "--max-num-batched-tokens", str(CHUNK))
    with serve(qwen3_5_dir, *args, log=log, timeout=600) as url:
        got = concurrent_greedy(url, prompts, 16)
    assert_greedy_equal(prompts, got, expected)
    text = log.read_text()
    assert "Prefix caching off" not in text
    assert "recurrent(a state per 64-token block) layers [" in text  # vLLM's align mode
