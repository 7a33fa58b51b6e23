"""TT metrics on `vllm serve`'s /metrics: after mixed traffic (chunked prefills, batched decode,
a logit_bias request that samples on the host) the `vllm_tt:*` series agree with the step trace
and the sampling trace, with one API server and with two (vLLM's multiprocess Prometheus)."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.helpers import serve

pytestmark = pytest.mark.e2e

BUDGET = 64
SERVE_ARGS = ("--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512",
              "--max-num-batched-tokens", str(BUDGET), "--additional-config.tt.sample_on_device_mode", "all",
              "--additional-config.tt.host_device_time", "1ms")
PROMPTS = [[(i * 31 + k) % 900 + 3 for i in range(n)] for k, n in enumerate((10, 150, 40))]
"""The 150-token prompt is chunked over the 64-token budget."""


def complete(url: str, prompt: list[int], **extra: Any) -> None:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, **extra}
    httpx.post(f"{url}/v1/completions", json=body, timeout=120).raise_for_status()


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("model_name", "engine")))): s.value
        for family in text_string_to_metric_families(text) if family.name.startswith("vllm_tt:")
        for s in family.samples
    }


def steps_by_phase(trace: Path) -> dict[str, list[dict[str, Any]]]:
    steps: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
    for line in trace.read_text().splitlines():
        step = json.loads(line)
        if step["phase"] in steps:
            steps[step["phase"]].append(step)
    return steps


@pytest.mark.parametrize("api_servers", [1, 2])
def test_tt_series_agree_with_the_step_and_sampling_traces(tiny_checkpoint, tmp_path, api_servers):
    step_trace, sampling_trace = tmp_path / "steps.jsonl", tmp_path / "sampling.jsonl"
    env = {"TT_STEP_TRACE": str(step_trace), "TT_SAMPLING_TRACE": str(sampling_trace)}
    args = (*SERVE_ARGS, "--api-server-count", str(api_servers))
    with serve(tiny_checkpoint("llama"), *args, env=env, log=tmp_path / "serve.log", timeout=900) as url:
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda p: complete(url, p), PROMPTS))
        complete(url, PROMPTS[0], logit_bias={"7": 5.0})  # host sampling: logit_bias
        traced = steps_by_phase(step_trace)
        expected_steps = {phase: float(len(steps)) for phase, steps in traced.items()}

        # The engine flushes every 0.25 s. With two API servers /metrics reads each process's
        # counter and histogram files one after the other, so one scrape may show a delta's
        # steps and not yet its histograms: wait for all steps, then for two equal scrapes.
        deadline, previous = time.monotonic() + 15, None
        while True:
            series = scrape(url)
            steps = {p: series.get(("vllm_tt:steps_total", (("phase", p),))) for p in expected_steps}
            if (steps == expected_steps and series == previous) or time.monotonic() > deadline:
                break
            previous = series
            time.sleep(0.5)
    assert steps == expected_steps, (steps, expected_steps)

    prefill_tokens = sum(sum(s["scheduled"].values()) for s in traced["prefill"])
    assert series[("vllm_tt:prefill_tokens_per_step_sum", ())] == prefill_tokens
    assert series[("vllm_tt:prefill_tokens_per_step_count", ())] == len(traced["prefill"])
    assert any(len(s["scheduled"]) < 4 for s in traced["decode"])
    assert series[("vllm_tt:decode_rows_used_total", ())] == sum(len(s["scheduled"]) for s in traced["decode"])
    assert series[("vllm_tt:decode_rows_total", ())] == 4 * len(traced["decode"])  # the fixed decode batch

    decisions = [json.loads(line) for line in sampling_trace.read_text().splitlines()]
    host_bias = sum(1 for d in decisions if d["path"] == "host" and d["reason"] == "logit_bias")
    assert host_bias > 0
    assert series[("vllm_tt:sampling_batches_total", (("path", "host"), ("reason", "logit_bias")))] == host_bias
    device = sum(1 for d in decisions if d["path"] == "device")
    assert series[("vllm_tt:sampling_batches_total", (("path", "device"), ("reason", "device")))] == device

    # Modelled device time (1 ms per program) for every step but the last, which no later step closed.
    counts = {p: series[("vllm_tt:device_time_per_step_seconds_count", (("phase", p),))] for p in ("prefill", "decode")}
    assert sum(counts.values()) == sum(expected_steps.values()) - 1
    assert series[("vllm_tt:device_time_per_step_seconds_sum", (("phase", "decode"),))] >= 0.001 * counts["decode"]
    assert ("vllm_tt:lane_occupancy", (("lane", "0"),)) in series
