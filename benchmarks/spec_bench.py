"""Speculative decoding benchmark: single-stream decode with and without n-gram drafts.

Runs vLLM's engine in-process on the host mesh backend with modelled device time (the host
backend's cost model of Llama 3.1 8B on an N150: a decode step reads the weights once, a verify
step of ``1 + K`` tokens costs the larger of that and its matmuls, plus the read-back of every
position's logits) and the tiny Llama's real math (its tokens decide what the drafts hit). One
request at a time:

* ``repetitive``: prompts that repeat a phrase (code edits, quoted context), greedy: drafts
  mostly hit (the tiny model also falls into loops of its own);
* ``random``: random-token prompts, sampled at temperature 1 (top-k 32) with a fixed seed per
  request: the tiny model's next-token distribution is nearly flat there, so the drafts the
  n-gram drafter proposes (whenever the last token recurs) miss almost always; they must cost
  almost nothing.

For each workload and K in {2, 3, 5} (and without speculation) it reports decode tokens/s and
mean per-token latency on the **modelled device clock** (the modelled durations of the
programs each request ran from its first token to its last: independent of host load), the
wall-clock tokens/s for reference (device clock plus host overhead: load-dependent), vLLM's
draft acceptance rate, and the speed-up over no speculation on the device clock. Targets:
>= 1.6x on repetitive at K=3, >= 0.97x on random. Seeded sampled rows keep the tokens they get
without speculation, so both workloads also check that every case produced the same tokens.

    python benchmarks/spec_bench.py [--quick]

Writes benchmarks/results/spec_bench.json and spec_bench.md.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from report import bench_main, targets_lines

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TT_MESH_BACKEND", "host")

RESULTS = Path(__file__).parent / "results"
DEVICE_TIME = "llama-3.1-8b@N150"
KS = (2, 3, 5)
NEW_TOKENS = 64
SEED = 1000
"""Seed of the first sampled request (``random`` workload); request i gets SEED + i."""
SAMPLED_TOP_K = 32
"""The tiny model's 32 best tokens: sampled tokens recur, so the drafter proposes drafts on most
steps (from the whole vocabulary it rarely finds a match: few drafts, nothing measured)."""


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
                                   "prompt_lookup_min": 1}
    tt = {"mesh_backend": "host", "host_device_time": DEVICE_TIME}
    return LLMEngine.from_engine_args(EngineArgs(
        model=str(model_dir), max_num_seqs=4, max_model_len=512, seed=0, speculative_config=spec,
        enable_prefix_caching=False, additional_config={"tt": tt},
    ))


def single_stream(engine: Any, workload: list[list[int]], sampled: bool) -> dict[str, Any]:
    """Decode tokens/s and mean per-token latency (device clock and wall clock) and vLLM's
    draft acceptance, one request at a time; ``sampled``: temperature 1, seed per request."""
    from vllm.inputs import TokensPrompt

    device = engine.engine_core.engine_core.model_executor.driver_worker.worker.runner.mesh_device
    drafted, accepted = spec_counters(engine)
    device_s, wall_s, tokens, outputs = 0.0, 0.0, 0, []
    for i, prompt in enumerate(workload):
        engine.add_request(f"r{i}", TokensPrompt(prompt_token_ids=prompt), request_params(sampled, i))
        # The first step runs the prefill program only (its token comes out now, or with the next
        # step when plain decode overlaps); from here on every program is a decode or verify step.
        for out in engine.step():
            assert not out.finished
        start = (device.modelled_device_seconds, time.perf_counter())
        while engine.has_unfinished_requests():
            outputs += [list(out.outputs[0].token_ids) for out in engine.step() if out.finished]
        device_s += device.modelled_device_seconds - start[0]
        wall_s += time.perf_counter() - start[1]
        tokens += NEW_TOKENS - 1
    drafted_now, accepted_now = spec_counters(engine)
    drafts = drafted_now - drafted
    return {
        "tokens_per_s": tokens / device_s, "ms_per_token": device_s / tokens * 1e3,
        "wall_tokens_per_s": tokens / wall_s, "draft_tokens": drafts,
        "acceptance": (accepted_now - accepted) / drafts if drafts else None,
        "outputs": outputs,
    }


def request_params(sampled: bool, index: int) -> Any:
    """Greedy, or (``sampled``) temperature 1 and top-k 32 with seed ``SEED + index``."""
    from vllm import SamplingParams

    if sampled:
        return SamplingParams(temperature=1.0, top_k=SAMPLED_TOP_K, seed=SEED + index, max_tokens=NEW_TOKENS,
                              ignore_eos=True)
    return SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)


def spec_counters(engine: Any) -> tuple[int, int]:
    """vLLM's draft and accepted-draft token counters so far (0 without speculation)."""
    values = {m.name: int(getattr(m, "value", 0)) for m in engine.get_metrics()}
    return (values.get("vllm:spec_decode_num_draft_tokens", 0),
            values.get("vllm:spec_decode_num_accepted_tokens", 0))


def run(count: int) -> dict[str, Any]:
    from vllm_tt_host.tiny import build_tiny_checkpoint

    model_dir = Path(build_tiny_checkpoint("llama", Path(tempfile.gettempdir()) / "vllm-tt-bench-tiny-llama"))
    workloads = {kind: prompts(kind, count) for kind in ("repetitive", "random")}
    rows: dict[str, dict[str, Any]] = {kind: {} for kind in workloads}
    for k in (None, *KS):
        engine = make_engine(model_dir, k)
        try:
            single_stream(engine, workloads["repetitive"][:1], sampled=False)  # warm-up
            for kind, workload in workloads.items():
                name = "off" if k is None else f"K={k}"
                rows[kind][name] = single_stream(engine, workload, sampled=kind == "random")
        finally:
            engine.engine_core.shutdown()
    cases = []
    for kind, by_k in rows.items():
        base = by_k["off"]
        for name, m in by_k.items():
            cases.append({
                "workload": kind, "speculation": name, "tokens_per_s": m["tokens_per_s"],
                "ms_per_token": m["ms_per_token"], "speedup": m["tokens_per_s"] / base["tokens_per_s"],
                "wall_tokens_per_s": m["wall_tokens_per_s"], "draft_tokens": m["draft_tokens"],
                "acceptance": m["acceptance"], "same_tokens_as_off": m["outputs"] == base["outputs"],
            })
    speedup = {(c["workload"], c["speculation"]): c["speedup"] for c in cases}
    targets = {
        "repetitive K=3 >= 1.6x": speedup["repetitive", "K=3"] >= 1.6,
        "random K=2,3,5 >= 0.97x": all(speedup["random", f"K={k}"] >= 0.97 for k in KS),
        "tokens identical (greedy and seeded)": all(c["same_tokens_as_off"] for c in cases),
    }
    return {"cases": cases, "targets": targets}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Speculative decoding benchmark (n-gram, single stream)",
        "",
        f"Command: `{result['command']}`  ",
        f"Host: {result['host']}. Engine in-process, host mesh backend, modelled device time "
        f"`{DEVICE_TIME}`, tiny Llama's real math; {result['requests']} requests per workload, one at a "
        f"time, {NEW_TOKENS} new tokens each. repetitive: greedy; random: random prompts sampled at "
        f"temperature 1, top-k {SAMPLED_TOP_K}, seed per request. tokens/s, ms/token and speed-up are on "
        "the modelled device clock, from each request's first decode step to its last (host load does "
        "not change them); wall tokens/s adds this machine's host overhead.",
        "",
        "| workload | speculation | tokens/s | ms/token | speed-up | acceptance (drafts) | wall tokens/s "
        "| same tokens as off |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in result["cases"]:
        accepted = "-" if c["acceptance"] is None else f"{c['acceptance']:.0%} ({c['draft_tokens']})"
        lines.append(f"| {c['workload']} | {c['speculation']} | {c['tokens_per_s']:.1f} | "
                     f"{c['ms_per_token']:.2f} | {c['speedup']:.2f}x | {accepted} | "
                     f"{c['wall_tokens_per_s']:.1f} | "
                     f"{'yes' if c['same_tokens_as_off'] else 'NO'} |")
    return "\n".join(lines + targets_lines(result["targets"])) + "\n"


def main() -> None:
    bench_main(__doc__, "spec_bench", "two requests per workload (smoke run)",
               lambda quick: {"requests": 2 if quick else 6, **run(2 if quick else 6)}, markdown, RESULTS)


if __name__ == "__main__":
    main()
