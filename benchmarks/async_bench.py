"""Overlapped decode benchmark: steady-state decode step time with overlap on versus off.

Runs vLLM's engine in-process on the host mesh backend with modelled device time (the host
backend's cost model or a fixed duration) and skipped model math, batch 32, device sampling.
For each device time D:

* ``H``: host time per step, measured with the same engine and an instant device (D = 0);
* ``off``: step time with async scheduling off (expected ~ D + H);
* ``on``: step time with async scheduling on, steady steps overlapped (target <= 1.1 x max(D, H));
* host overhead with overlap on: how long the device sits idle waiting for the host per step,
  ``(on - device busy) / D``, as a fraction of D (target <= 2 % for the two cost models). The
  device's busy time is measured, so the emulator's own lateness (sleep overshoot, a loaded
  machine) is not counted as host overhead; ``(on - D) / D`` is reported next to it.

    python benchmarks/async_bench.py [--quick] [--steps 100]

Writes benchmarks/results/async_bench.json and async_bench.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from report import write_results

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TT_MESH_BACKEND", "host")

RESULTS = Path(__file__).parent / "results"
BATCH = 32
PROMPT = 32
DEVICE_TIMES = ("llama-3.1-8b@N150", "llama-3.3-70b@TG", "2ms", "10ms")
"""The two cost models of the targets, and two fixed durations either side of the host time."""
COST_MODELS = DEVICE_TIMES[:2]
GIL_SWITCH_S = 0.00005


@dataclass
class Measurement:
    step_ms: float
    """Median wall time of one engine step (robust to bursts of other work on a shared host)."""
    mean_step_ms: float
    device_ms: float
    """Modelled device time per decode step (the cost model at the steps' KV lengths)."""
    busy_ms: float
    """Wall time the emulated device was busy per decode step (modelled time, sleep overshoot)."""
    overlapped: float
    """Fraction of measured steps submitted while the previous one was in flight."""


def make_engine(model_dir: Path, device_time: str, overlap: bool):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    tt = {"mesh_backend": "host", "sample_on_device_mode": "all", "host_device_time": device_time,
          "host_skip_math": True}
    return LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), max_num_seqs=BATCH, max_model_len=1024, seed=0, async_scheduling=overlap,
        enable_prefix_caching=False, additional_config={"tt": tt},
    ))


def steady_decode(model_dir: Path, device_time: str, overlap: bool, steps: int) -> Measurement:
    """Mean step time over ``steps`` engine steps once all BATCH requests are decoding."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = make_engine(model_dir, device_time, overlap)
    runner = engine.engine_core.engine_core.model_executor.driver_worker.worker.runner
    try:
        params = SamplingParams(temperature=0.0, max_tokens=steps + 64, ignore_eos=True)
        for i in range(BATCH):
            engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=[3 + (i + j) % 900 for j in range(PROMPT)]),
                               params)
        produced: dict[str, int] = {}
        while len(produced) < BATCH or min(produced.values()) < 4:  # prefills done, decode running
            for out in engine.step():
                produced[out.request_id] = len(out.outputs[0].token_ids)
        for _ in range(5):
            engine.step()
        queue = runner.mesh_device.command_queue
        busy, modelled, programs = queue.stats.busy_s, queue.stats.modelled_s, queue.stats.programs
        overlapped = runner.overlap.stats.overlapped
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - start)
        decode_programs = max(queue.stats.programs - programs, 1)
        return Measurement(
            step_ms=statistics.median(times) * 1e3,
            mean_step_ms=statistics.fmean(times) * 1e3,
            device_ms=(queue.stats.modelled_s - modelled) / decode_programs * 1e3,
            busy_ms=(queue.stats.busy_s - busy) / decode_programs * 1e3,
            overlapped=(runner.overlap.stats.overlapped - overlapped) / steps,
        )
    finally:
        engine.engine_core.shutdown()


def run(steps: int) -> dict:
    from vllm_tt_host.tiny import build_tiny_checkpoint

    model_dir = Path(build_tiny_checkpoint("llama", Path(tempfile.gettempdir()) / "vllm-tt-bench-tiny-llama"))
    # The emulated device is a Python thread: with the default 5 ms GIL switch interval, its short
    # bursts of work would wait behind the host thread for milliseconds, which no real device does.
    sys.setswitchinterval(GIL_SWITCH_S)
    steady_decode(model_dir, "0ms", overlap=False, steps=steps)  # warm-up: first-run costs
    host = steady_decode(model_dir, "0ms", overlap=False, steps=steps)
    cases = []
    for device_time in DEVICE_TIMES:
        off = steady_decode(model_dir, device_time, overlap=False, steps=steps)
        on = steady_decode(model_dir, device_time, overlap=True, steps=steps)
        cases.append((device_time, off, on))
    again = steady_decode(model_dir, "0ms", overlap=False, steps=steps)
    h = min(host.step_ms, again.step_ms)
    results = []
    for device_time, off, on in cases:
        d = on.device_ms
        idle = max(on.step_ms - on.busy_ms, 0.0) / d
        results.append({
            "device_time": device_time, "D_ms": d, "H_ms": h, "off": asdict(off), "on": asdict(on),
            "on_over_max_DH": on.step_ms / max(d, h), "off_over_D_plus_H": off.step_ms / (d + h),
            "host_overhead_of_D": idle, "on_minus_D_of_D": (on.step_ms - d) / d,
            "targets": {
                "on <= 1.1 max(D,H)": on.step_ms <= 1.1 * max(d, h),
                **({"host overhead <= 2% of D": idle <= 0.02} if device_time in COST_MODELS else {}),
            },
        })
    return {"host_step_ms": [host.step_ms, again.step_ms], "cases": results}


def markdown(result: dict) -> str:
    lines = [
        f"# Overlapped decode benchmark (batch {BATCH}, steady decode)",
        "",
        f"Command: `{result['command']}`  ",
        f"Host: {result['host']}. Engine in-process, host mesh backend, skipped model math, device "
        f"sampling; {result['steps']} measured steps per run, step times are medians. Wall-clock on a "
        "shared machine: read the ratios, not the last digit.",
        "",
        f"Host time per step H (instant device, overlap off; best of a run before and after the "
        f"cases): {min(result['host_step_ms']):.2f} ms. "
        f"GIL switch interval {GIL_SWITCH_S * 1e3:g} ms (the emulated device is a Python thread).",
        "",
        "| Device time | D (ms) | H (ms) | off (ms) | off / (D+H) | on (ms) | on / max(D,H) | overlapped "
        "| device busy (ms) | host overhead (on-busy)/D | (on-D)/D | targets |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for c in result["cases"]:
        targets = ", ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in c["targets"].items())
        lines.append(
            f"| `{c['device_time']}` | {c['D_ms']:.2f} | {c['H_ms']:.2f} | {c['off']['step_ms']:.2f} | "
            f"{c['off_over_D_plus_H']:.2f} | {c['on']['step_ms']:.2f} | {c['on_over_max_DH']:.3f} | "
            f"{c['on']['overlapped']:.0%} | {c['on']['busy_ms']:.2f} | {c['host_overhead_of_D']:.1%} | "
            f"{c['on_minus_D_of_D']:+.1%} | {targets} |"
        )
    lines += [
        "",
        "D is the modelled device time per decode step (cost model at the steps' KV lengths, or the "
        "fixed duration); device busy is what the emulated device actually spent (D plus sleep "
        "overshoot). With overlap on, a steady step costs max(D, H): the host prepares step N+1 while "
        "the device runs step N; off, it costs D + H. Host overhead is the device's idle time per "
        "step while overlapped (step time minus device busy time), as a fraction of D.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps (smoke run)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per run (default 100; 20 quick)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    steps = args.steps or (20 if args.quick else 100)
    import torch

    result = {
        "command": "python benchmarks/async_bench.py" + (" --quick" if args.quick else "")
        + (f" --steps {args.steps}" if args.steps else ""),
        "host": f"{platform.machine()} torch {torch.__version__}, {os.cpu_count()} cores",
        "batch": BATCH,
        "steps": steps,
        **run(steps),
    }
    write_results(result, args.out / "async_bench.json", args.out / "async_bench.md", markdown(result))


if __name__ == "__main__":
    main()
