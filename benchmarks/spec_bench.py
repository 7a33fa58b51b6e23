"""Speculative decoding benchmark: single-stream decode with and without n-gram drafts.

Runs vLLM's engine in-process on the host mesh backend with modelled device time (the host
backend's cost model of Llama 3.1 8B on an N150: a decode step reads the weights once, a verify
step of ``1 + K`` tokens costs the larger of that and its matmuls) and the tiny Llama's real
math (its greedy tokens decide what the drafts hit). One request at a time, greedy:

* ``repetitive``: prompts that repeat a phrase (code edits, quoted context): drafts mostly hit;
* ``random``: random-token prompts: drafts mostly miss (they must cost almost nothing).

For each workload and K in {2, 3, 5} (and without speculation) it reports decode tokens/s and
mean per-token latency (wall time from the first token to the last, per token), and the
speed-up over no speculation. Targets: >= 1.6x on repetitive at K=3, >= 0.97x on random.

    python benchmarks/spec_bench.py [--quick]

Writes benchmarks/results/spec_bench.json and spec_bench.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from report import write_results

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TT_MESH_BACKEND", "host")

RESULTS = Path(__file__).parent / "results"
DEVICE_TIME = "llama-3.1-8b@N150"
KS = (2, 3, 5)
NEW_TOKENS = 64


def prompts(kind: str, count: int, vocab: int = 1000) -> list[list[int]]:
    rng = random.Random({"repetitive": 1, "random": 2}[kind])
    if kind == "random":
        return [[rng.randrange(3, vocab) for _ in range(96)] for _ in range(count)]
    out = []
    for _ in range(count):
        phrase = [rng.randrange(3, vocab) for _ in range(rng.randrange(6, 14))]
        out.append((phrase * 12)[:96])
    return out


def make_engine(model_dir: Path, k: int | None) -> Any:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    spec = None if k is None else {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4,
                                   "prompt_lookup_min": 2}
    tt = {"mesh_backend": "host", "host_device_time": DEVICE_TIME}
    return LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), max_num_seqs=4, max_model_len=512, seed=0, speculative_config=spec,
        enable_prefix_caching=False, additional_config={"tt": tt},
    ))


def single_stream(engine: Any, workload: list[list[int]]) -> dict[str, Any]:
    """Decode tokens/s and mean per-token latency, one request at a time."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    decode_s, tokens, outputs = 0.0, 0, []
    for i, prompt in enumerate(workload):
        engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=prompt), params)
        first: float | None = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter()
                if out.finished:
                    outputs.append(list(out.outputs[0].token_ids))
        assert first is not None
        decode_s += time.perf_counter() - first
        tokens += NEW_TOKENS - 1
    return {"tokens_per_s": tokens / decode_s, "ms_per_token": decode_s / tokens * 1e3, "outputs": outputs}


def run(count: int) -> dict[str, Any]:
    from vllm_tt_platform.host.tiny import build_tiny_checkpoint

    model_dir = Path(build_tiny_checkpoint("llama", Path(tempfile.gettempdir()) / "vllm-tt-bench-tiny-llama"))
    workloads = {kind: prompts(kind, count) for kind in ("repetitive", "random")}
    rows: dict[str, dict[str, Any]] = {kind: {} for kind in workloads}
    for k in (None, *KS):
        engine = make_engine(model_dir, k)
        try:
            single_stream(engine, workloads["repetitive"][:1])  # warm-up: first-run costs
            for kind, workload in workloads.items():
                rows[kind]["off" if k is None else f"K={k}"] = single_stream(engine, workload)
        finally:
            engine.engine_core.shutdown()
    cases = []
    for kind, by_k in rows.items():
        base = by_k["off"]
        for name, m in by_k.items():
            cases.append({
                "workload": kind, "speculation": name, "tokens_per_s": m["tokens_per_s"],
                "ms_per_token": m["ms_per_token"], "speedup": m["tokens_per_s"] / base["tokens_per_s"],
                "same_tokens_as_off": m["outputs"] == base["outputs"],
            })
    speedup = {(c["workload"], c["speculation"]): c["speedup"] for c in cases}
    targets = {
        "repetitive K=3 >= 1.6x": speedup["repetitive", "K=3"] >= 1.6,
        "random K=2,3,5 >= 0.97x": all(speedup["random", f"K={k}"] >= 0.97 for k in KS),
        "greedy tokens identical": all(c["same_tokens_as_off"] for c in cases),
    }
    return {"cases": cases, "targets": targets}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Speculative decoding benchmark (n-gram, single stream, greedy)",
        "",
        f"Command: `{result['command']}`  ",
        f"Host: {result['host']}. Engine in-process, host mesh backend, modelled device time "
        f"`{DEVICE_TIME}`, tiny Llama's real math; {result['requests']} requests per workload, one at a "
        f"time, {NEW_TOKENS} new tokens each. Wall-clock on a shared machine: read the ratios.",
        "",
        "| workload | speculation | tokens/s | ms/token | speed-up | same tokens as off |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in result["cases"]:
        lines.append(f"| {c['workload']} | {c['speculation']} | {c['tokens_per_s']:.1f} | {c['ms_per_token']:.2f} | "
                     f"{c['speedup']:.2f}x | {'yes' if c['same_tokens_as_off'] else 'NO'} |")
    lines += ["", "Targets: " + ", ".join(f"{n}: {'yes' if ok else 'NO'}" for n, ok in result["targets"].items())]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two requests per workload (smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    count = 2 if args.quick else 6
    import torch

    result = {
        "command": "python benchmarks/spec_bench.py" + (" --quick" if args.quick else ""),
        "host": f"{platform.machine()} torch {torch.__version__}, {os.cpu_count()} cores",
        "requests": count,
        **run(count),
    }
    write_results(result, args.out / "spec_bench.json", args.out / "spec_bench.md", markdown(result))


if __name__ == "__main__":
    main()
