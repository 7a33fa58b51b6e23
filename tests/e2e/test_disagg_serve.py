"""Disaggregated prefill/decode: two `vllm serve` engines on loopback joined by vLLM's
shared-storage ``ExampleConnector`` (the TT worker side moves whole KV blocks between the mesh
and the shared folder), a router in front in vLLM's proxy pattern (prefill with
``max_tokens=1``, then the same request to the decode engine). Every answer equals
transformers' greedy continuation, and the decode engine computed only the prompt tokens
vLLM's connector leaves to it: those after the last whole block before the prompt's last token."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached_tiny

from tests.e2e.disagg_router import disagg_router
from tests.e2e.helpers import (
    assert_greedy_equal,
    concurrent_greedy,
    hf_greedy,
    seeded_prompts,
    serve,
    served_metric,
)

pytestmark = pytest.mark.e2e

BLOCK = 64
LENGTHS = (300, 150, 100)
MAX_NEW_TOKENS = 8
TRAIN_STEPS = 200
LOCAL_COMPUTE = 'source="local_compute"'
EXTERNAL = 'source="external_kv_transfer"'


def loaded(length: int) -> int:
    """Prompt tokens vLLM's ExampleConnector loads: whole blocks before the last prompt token."""
    return (length - 2) // BLOCK * BLOCK


def _kv(role: str, storage: Path) -> str:
    return json.dumps({"kv_connector": "ExampleConnector", "kv_role": role,
                       "kv_connector_extra_config": {"shared_storage_path": str(storage)}})


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("disagg")
    storage = root / "kv"
    model_dir = cached_tiny("llama", TRAIN_STEPS)
    common = ("--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512")
    env = {"VLLM_HOST_IP": "127.0.0.1"}
    with contextlib.ExitStack() as stack:
        prefill = stack.enter_context(serve(
            model_dir, *common, "--no-enable-chunked-prefill", "--kv-transfer-config", _kv("kv_producer", storage),
            env=env, log=root / "prefill.log", timeout=900))
        decode = stack.enter_context(serve(
            model_dir, *common, "--kv-transfer-config", _kv("kv_consumer", storage),
            env=env, log=root / "decode.log", timeout=900))
        router = stack.enter_context(disagg_router(prefill, decode))
        yield model_dir, storage, prefill, decode, router


def test_prefill_on_one_engine_decode_on_the_other(engines):
    model_dir, storage, prefill, decode, router = engines
    prompts = seeded_prompts(5, LENGTHS)
    got = concurrent_greedy(router, prompts, MAX_NEW_TOKENS)
    assert_greedy_equal(prompts, got, hf_greedy(model_dir, prompts, MAX_NEW_TOKENS))
    # The prefill engine computed every prompt and stored its whole blocks, one file per layer.
    assert served_metric(prefill, "vllm:prompt_tokens_by_source_total", LOCAL_COMPUTE) == sum(LENGTHS)
    folders = sorted(storage.iterdir())  # renamed into place whole: no partial folder is left
    assert len(folders) == len(prompts)
    assert all(sorted(f.name for f in folder.iterdir()) == [f"model.layers.{i}.self_attn.safetensors" for i in (0, 1)]
               for folder in folders)
    # The decode engine loaded those blocks and ran only the rest of each prompt on the device.
    tails = sum(length - loaded(length) for length in LENGTHS)
    assert served_metric(decode, "vllm:prompt_tokens_by_source_total", EXTERNAL) == sum(map(loaded, LENGTHS))
    assert served_metric(decode, "vllm:prompt_tokens_by_source_total", LOCAL_COMPUTE) == tails
    # The TT metrics reach /metrics through the engine's metrics thread a moment later.
    deadline = time.monotonic() + 15
    while served_metric(decode, "vllm_tt:prefill_tokens_per_step_sum") != tails and time.monotonic() < deadline:
        time.sleep(0.25)
    assert served_metric(decode, "vllm_tt:prefill_tokens_per_step_sum") == tails
    assert served_metric(decode, "vllm:external_prefix_cache_hits_total") == sum(map(loaded, LENGTHS))


def test_a_streamed_chat_through_the_router_equals_the_unstreamed_one(engines):
    """The router streams the decode engine's answer; the chat template's prompt is the same on
    both engines, so the decode engine loads its blocks (the second time its own prefix cache
    holds them: vLLM asks the connector only for blocks beyond a local hit)."""
    _, _, _, decode, router = engines

    def decoded() -> tuple[float, float]:
        return (served_metric(decode, "vllm:prompt_tokens_by_source_total", EXTERNAL),
                served_metric(decode, "vllm:prompt_tokens_by_source_total", LOCAL_COMPUTE))

    body = {"model": "tiny", "messages": [{"role": "user", "content": "tell me about rivers " * 30}],
            "max_tokens": MAX_NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}
    external, computed = decoded()
    whole = httpx.post(f"{router}/v1/chat/completions", json=body, timeout=300).json()
    text = whole["choices"][0]["message"]["content"]
    prompt_tokens = whole["usage"]["prompt_tokens"]
    assert whole["usage"]["completion_tokens"] == MAX_NEW_TOKENS
    assert decoded() == (external + loaded(prompt_tokens), computed + prompt_tokens - loaded(prompt_tokens))
    streamed = ""
    with httpx.stream("POST", f"{router}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                streamed += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
    assert streamed == text
    assert decoded()[1] == computed + 2 * (prompt_tokens - loaded(prompt_tokens))
