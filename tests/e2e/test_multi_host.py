"""Past one host: vLLM's multi-node data parallelism on TT, two process trees on loopback as two
hosts (a head serving the OpenAI API, a ``--headless`` host running engines only).

1. a dense model (no ``single_program_lanes``), 2 ranks, one per host: 32 concurrent greedy
   requests through the head equal HF, and both hosts' engines served some;
2. a lanes model on ``MESH_DEVICE=TG`` with ``--data-parallel-size 8 --data-parallel-size-local 4``:
   one engine process per host of 4 lanes each, 64 concurrent greedy requests equal their
   single-request outputs, both hosts decoded;
3. killing the headless host (SIGKILL of its whole process tree) makes the head exit within 90 s
   with the platform's host watch naming the lost rank (vLLM 0.33 alone keeps the head answering
   ``/health``: docs/multi-host.md).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import random
import re
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import hf_greedy, two_hosts

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}


def _client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def _requests(count: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [{"prompt": [rng.randrange(3, 1000) for _ in range(rng.randint(4, 80))], "max_tokens": rng.randint(4, 10)}
            for _ in range(count)]


def _complete(client: Any, request: dict[str, Any]) -> list[int]:
    result = client.completions.create(model="tiny", **request, **GREEDY).model_dump()
    return result["choices"][0]["token_ids"]


def _concurrently(client: Any, requests: list[dict[str, Any]]) -> list[list[int]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(lambda r: _complete(client, r), requests))


def _finished_per_engine(url: str) -> dict[str, float]:
    """``vllm:request_success_total`` summed per engine index, from the head's /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    per_engine: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            engine = re.search(r'engine="(\d+)"', line)
            if engine:
                per_engine[engine.group(1)] = per_engine.get(engine.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return per_engine


def _engine_processes(proc: subprocess.Popen) -> list[str]:
    import psutil

    children = psutil.Process(proc.pid).children(recursive=True)
    return [c.name() for c in children if "EngineCore" in c.name() or "EngineCore" in " ".join(c.cmdline())]


@pytest.fixture(scope="module")
def dense_bundle(tmp_path_factory) -> Path:
    """The tiny Llama served by a model without single_program_lanes: vLLM's own DP ranks."""
    root = tmp_path_factory.mktemp("dense_bundles")
    bundle = root / "dense_llama_multi_host"
    bundle.mkdir()
    (bundle / "vllm_metadata.json").write_text(
        json.dumps({"arch": "LlamaForCausalLM", "main_class": "dense_llama_multi_host:DenseLlama"}))
    (bundle / "dense_llama_multi_host.py").write_text(textwrap.dedent("""
        from vllm_tt_host.models.families import HostLlamaForCausalLM

        class DenseLlama(HostLlamaForCausalLM):
            model_capabilities = {**HostLlamaForCausalLM.model_capabilities, "single_program_lanes": False}
    """))
    return root


def _exit_seconds(proc: subprocess.Popen, limit: float) -> float:
    """Seconds until ``proc`` exits (fails after ``limit``)."""
    start = time.monotonic()
    proc.wait(timeout=limit)
    return time.monotonic() - start


def test_dense_ranks_on_two_hosts_equal_hf_and_the_head_stops_when_the_other_host_dies(
        tiny_checkpoint, dense_bundle, tmp_path):
    model = tiny_checkpoint("llama")
    requests = _requests(32, seed=11)
    with two_hosts(model, tmp_path, 2, 1, "--max-num-seqs", "8", "--max-model-len", "256",
                   env={"EXTRA_MODELS_DIR": str(dense_bundle)}) as hosts:
        got = _concurrently(_client(hosts.url), requests)
        served = _finished_per_engine(hosts.url)
        os.killpg(hosts.headless.pid, signal.SIGKILL)  # the whole host, without a word
        stopped_after = _exit_seconds(hosts.head, 90)
    expected = [hf_greedy(model, [r["prompt"]], r["max_tokens"])[0] for r in requests]
    assert got == expected
    assert set(served) == {"0", "1"} and all(v > 0 for v in served.values()), served
    assert "DP rank 0 (local 0 of 1): sub-mesh (1,1), devices [0]" in hosts.head_log.read_text()
    assert "DP rank 1 (local 0 of 1): sub-mesh (1,1), devices [0]" in hosts.headless_log.read_text()
    head_log = hosts.head_log.read_text()
    assert "Host watch: lost DP rank 1 at 127.0.0.1" in head_log, head_log[-3000:]
    print(f"head exited {stopped_after:.1f} s after the headless host was killed")


def test_lanes_on_every_host(tiny_checkpoint, tmp_path):
    model = tiny_checkpoint("llama")
    requests = _requests(64, seed=12)
    with two_hosts(model, tmp_path, 8, 4, "--max-num-seqs", "8", "--max-model-len", "256",
                   env={"MESH_DEVICE": "TG"}) as hosts:
        engines = {"head": _engine_processes(hosts.head), "headless": _engine_processes(hosts.headless)}
        client = _client(hosts.url)
        alone = [_complete(client, r) for r in requests[:4]]
        together = _concurrently(client, requests)
        served = _finished_per_engine(hosts.url)
    assert together[:4] == alone
    expected = [hf_greedy(model, [r["prompt"]], r["max_tokens"])[0] for r in requests[:8]]
    assert together[:8] == expected
    assert [len(v) for v in engines.values()] == [1, 1], engines
    assert set(served) == {"0", "1"} and all(v > 0 for v in served.values()), served
    for log in (hosts.head_log, hosts.headless_log):
        assert "2 hosts x 4 lanes x 8 rows" in log.read_text()
