"""Every KV kind the shared-storage connector serves round-trips between two engines: a
prefill engine stores a model's blocks (sliding-window and full attention for Gemma 3, latent
attention for DeepSeek V3), a second engine over the same folder loads them and continues
exactly as transformers does, having computed only each prompt's tail. (Recurrent-state and
cross-attention models are refused at startup: tests/test_validation.py.)"""

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

pytestmark = pytest.mark.e2e

BLOCK = 64
LENGTHS = (200, 90)
"""Longer than Gemma 3's tiny window (32): its sliding layers' answers depend on the window's
placement over the loaded blocks."""
MAX_NEW_TOKENS = 6


def _engine(model_dir, role: str, storage) -> object:
    kv = {"kv_connector": "ExampleConnector", "kv_role": role,
          "kv_connector_extra_config": {"shared_storage_path": str(storage)}}
    return offline_llm(model=str(model_dir), max_model_len=256, max_num_seqs=2, seed=0, kv_transfer_config=kv,
                       enable_chunked_prefill=role == "kv_consumer", disable_log_stats=False,
                       additional_config={"tt": {"mesh_backend": "host"}})


@pytest.mark.parametrize(("arch", "train_steps"), [("gemma3", 200), ("deepseek_v3", 120)])
def test_kv_kind_round_trips_between_engines(arch, train_steps, tmp_path):
    model_dir = cached_tiny(arch, train_steps)
    prompts = seeded_prompts(9, LENGTHS)
    producer = _engine(model_dir, "kv_producer", tmp_path)
    offline_greedy(producer, prompts, 1)
    del producer
    consumer = _engine(model_dir, "kv_consumer", tmp_path)
    got = offline_greedy(consumer, prompts, MAX_NEW_TOKENS)
    loaded = sum((length - 2) // BLOCK * BLOCK for length in LENGTHS)
    assert metric_total(consumer, "vllm:external_prefix_cache_hits") == loaded
    computed = sum(int(m.value) for m in consumer.get_metrics()
                   if m.name == "vllm:prompt_tokens_by_source" and m.labels.get("source") == "local_compute")
    assert computed == sum(LENGTHS) - loaded  # only the tails ran
    del consumer
    assert_greedy_equal(prompts, got, hf_greedy(model_dir, prompts, MAX_NEW_TOKENS))
