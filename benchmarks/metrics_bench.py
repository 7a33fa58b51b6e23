#!/usr/bin/env python
"""Host cost of the TT metrics: engine step time with metrics on versus off.

One in-process engine on the host mesh backend (model math skipped, no modelled device time, so
the step is pure host work: scheduler, runner, host bookkeeping), batch 32 in steady decode. The
runner's metrics are switched between the null object and the real recorder (whose deltas a
separate process drains, as an API server would) in alternating blocks of steps on the same
engine, so both see the same batch and the same machine load. Reports the median step time of
each and their ratio (target: on within 2 % of off), and the cost of one ``step()`` record.

    python benchmarks/metrics_bench.py [--blocks 12] [--steps 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TT_MESH_BACKEND", "host")

BATCH = 32
DRAIN = """
import sys, zmq
socket = zmq.Context().socket(zmq.PULL)
socket.connect(sys.argv[1])
while True:
    socket.recv()
"""


def make_engine(model_dir: Path):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    tt = {"mesh_backend": "host", "sample_on_device_mode": "all", "host_skip_math": True}
    return LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), max_num_seqs=BATCH, max_model_len=2048, seed=0, enable_prefix_caching=False,
        additional_config={"tt": tt},
    ))


def measure(blocks: int, steps: int) -> dict[str, float]:
    import vllm_tt_platform.runner.step_metrics as step_metrics
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm_tt_host.tiny import build_tiny_checkpoint
    from vllm_tt_platform.metrics.engine import NULL_STEP_METRICS

    folder = Path(tempfile.mkdtemp(prefix="metrics-bench-"))
    engine = make_engine(build_tiny_checkpoint("llama", folder / "llama"))
    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker.runner
    os.environ["VLLM_TT_METRICS"] = f"ipc://{folder}/metrics"
    recorder = step_metrics.open_runner_metrics(runner.vllm_config, runner.batch, runner.overlap.stats,
                                                runner.mesh_device)
    drain = subprocess.Popen([sys.executable, "-c", DRAIN, f"ipc://{folder}/metrics-0"])
    try:
        params = SamplingParams(temperature=0.0, max_tokens=blocks * steps * 2 + 64, ignore_eos=True)
        for i in range(BATCH):
            engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=[3 + (i + j) % 900 for j in range(32)]), params)
        for _ in range(BATCH + 10):  # prefills, then decode running
            engine.step()
        times: dict[str, list[float]] = {"off": [], "on": []}
        for block in range(2 * blocks):
            mode = "off" if block % 2 == 0 else "on"
            runner.metrics = recorder if mode == "on" else NULL_STEP_METRICS
            for _ in range(steps):
                start = time.perf_counter()
                engine.step()
                times[mode].append(time.perf_counter() - start)
        runner.metrics = NULL_STEP_METRICS
        record_us = _record_cost_us(recorder)
    finally:
        recorder.close()
        drain.kill()
        engine.engine_core.shutdown()
    off, on = statistics.median(times["off"]), statistics.median(times["on"])
    return {"off_ms": off * 1e3, "on_ms": on * 1e3, "ratio": on / off, "record_us": record_us,
            "steps_each": float(len(times["on"]))}


def _record_cost_us(recorder, calls: int = 20_000) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        recorder.step("decode", tokens=BATCH, rows_used=BATCH, rows=BATCH, sampling="device:device")
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=12, help="alternating blocks per mode")
    parser.add_argument("--steps", type=int, default=40, help="engine steps per block")
    args = parser.parse_args()
    result = measure(args.blocks, args.steps)
    print(f"step (median of {result['steps_each']:.0f}): metrics off {result['off_ms']:.3f} ms, "
          f"on {result['on_ms']:.3f} ms, on/off {result['ratio']:.4f}; one step() record {result['record_us']:.2f} us")


if __name__ == "__main__":
    main()
