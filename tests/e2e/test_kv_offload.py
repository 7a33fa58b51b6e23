"""KV offloading to host memory (``--kv-offloading-size``, vLLM's native OffloadingConnector
with the TT transfer handler): a device pool too small for the prompts it served, the same long
prompts sent again, the second round's prefixes loaded back from host memory instead of being
recomputed, and every output equal to transformers' greedy continuation."""

from __future__ import annotations

import random

import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.helpers import greedy_one_by_one, hf_greedy, offline_llm

pytestmark = pytest.mark.e2e

BLOCK = 64
DEVICE_BLOCKS = 12
"""11 usable blocks (block 0 is vLLM's null block): two 300-token prompts evict the first."""
PROMPT_LEN = 300
MAX_NEW_TOKENS = 8
TRAIN_STEPS = 200


@pytest.fixture(scope="module")
def engine():
    model_dir = cached_tiny("llama", TRAIN_STEPS)
    llm = offline_llm(
        model=str(model_dir), max_num_seqs=2, max_model_len=512, seed=0, num_gpu_blocks_override=DEVICE_BLOCKS,
        enable_prefix_caching=True, kv_offloading_size=0.01, disable_log_stats=False,
        # Modelled device time: copies run on the device thread, asynchronously, on the clock.
        additional_config={"tt": {"mesh_backend": "host", "host_device_time": "served"}},
    )
    yield model_dir, llm
    del llm


def _counters(llm) -> dict[str, float]:
    wanted = ("vllm:kv_offload_load_bytes", "vllm:kv_offload_store_bytes", "vllm:external_prefix_cache_hits",
              "vllm:prefix_cache_hits")
    found = {m.name: float(m.value) for m in llm.get_metrics() if m.name in wanted}
    return {name: found.get(name, 0.0) for name in wanted}  # a counter appears once it counted


def _one_by_one(llm, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    return greedy_one_by_one(llm, prompts, MAX_NEW_TOKENS)


def test_evicted_prefixes_come_back_from_host_memory(engine):
    model_dir, llm = engine
    rng = random.Random(7)
    vocab = llm.get_tokenizer().vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT_LEN)] for _ in range(3)]
    first = _one_by_one(llm, prompts)
    stored = _counters(llm)
    assert stored["vllm:kv_offload_store_bytes"] > 0, stored
    assert [cached for _, cached in first] == [0, 0, 0]
    second = _one_by_one(llm, prompts)
    after = _counters(llm)
    full_blocks = PROMPT_LEN // BLOCK * BLOCK
    # Every prefix hit its full blocks again; the first prompt's had all left the device.
    assert [cached for _, cached in second] == [full_blocks] * 3, second
    loaded = after["vllm:external_prefix_cache_hits"] - stored["vllm:external_prefix_cache_hits"]
    assert loaded >= full_blocks, after
    assert after["vllm:kv_offload_load_bytes"] > stored["vllm:kv_offload_load_bytes"]
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    assert [tokens for tokens, _ in first] == expected
    assert [tokens for tokens, _ in second] == expected


def test_concurrent_requests_sharing_an_offloaded_prefix(engine):
    """Two requests at once whose common 256-token prefix was offloaded and evicted: both load
    it (or one loads and the other hits it on the device) and both equal transformers."""
    model_dir, llm = engine
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(11)
    vocab = llm.get_tokenizer().vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(4 * BLOCK)]
    prompts = [prefix + [rng.randrange(3, vocab) for _ in range(20)] for _ in range(2)]
    fillers = [[rng.randrange(3, vocab) for _ in range(PROMPT_LEN)] for _ in range(2)]
    _one_by_one(llm, [prompts[0], *fillers])  # the prefix is stored, then pushed off the device
    before = _counters(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    after = _counters(llm)
    assert after["vllm:external_prefix_cache_hits"] > before["vllm:external_prefix_cache_hits"]
    assert [o.num_cached_tokens for o in outs] == [4 * BLOCK] * 2
    assert [list(o.outputs[0].token_ids) for o in outs] == hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
