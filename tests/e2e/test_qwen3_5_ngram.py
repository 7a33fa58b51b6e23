"""Speculative decoding with n-gram drafts on Qwen 3.5 (issue 31), one engine start: verify steps
over a recurrent-hybrid model. vLLM gives each request ``1 + K`` state blocks per delta-net layer
(``num_speculative_blocks``, its ``none`` state mode: prefix caching off, said at startup); the
runner sends them as a ring by position, so each verify position leaves its state in its own
block and the next step reads the one of the last token vLLM kept. Greedy outputs equal
transformers' with 24 requests at once on 4 rows (long prompts prefilled in chunks, a block pool
small enough that vLLM preempts rows with drafts in flight) while drafts are accepted and
rejected. Device sampling is on, so these all-greedy verify steps take the model's device path
(argmax ids read back: the decision tests/e2e/test_spec_decode_serve.py counts); the MTP tests
verify on the host. The MTP module: test_mtp.py (one engine per family)."""

from __future__ import annotations

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import assert_greedy_equal, hf_greedy, offline_llm
from tests.e2e.spec_checks import counter, generate, mixed_prompts

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 24
TRAIN_STEPS = 100
"""The recipe packages/tt-host/tests/test_host_qwen3_5.py builds (one build a session)."""


def test_greedy_equals_transformers_with_24_requests_chunks_and_preemption():
    from vllm import SamplingParams

    model_dir = cached_tiny("qwen3_5", TRAIN_STEPS)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to inspect it
        llm = offline_llm(
            model=str(model_dir), max_num_seqs=4, max_model_len=256, seed=0, block_size=32,
            speculative_config={"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3,
                                "prompt_lookup_min": 1},
            num_gpu_blocks_override=30, max_num_batched_tokens=64, disable_log_stats=False,
            additional_config={"tt": {"mesh_backend": "host", "sample_on_device_mode": "all"}},
        )
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        assert not cache.enable_prefix_caching and cache.mamba_cache_mode == "none"
        groups = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config.kv_cache_groups
        assert sorted(getattr(g.kv_cache_spec, "num_speculative_blocks", -1) for g in groups) == [-1, K, K, K]
        prompts = mixed_prompts(llm.get_tokenizer().vocab_size)
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
        got = generate(llm, prompts, params)
        drafted = counter(llm, "vllm:spec_decode_num_draft_tokens")
        accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
        preempted = counter(llm, "vllm:num_preemptions")
    finally:
        del llm
    assert_greedy_equal(prompts, got, hf_greedy(model_dir, prompts, MAX_NEW_TOKENS))
    assert 0 < accepted < drafted, (drafted, accepted)
    assert preempted > 0
