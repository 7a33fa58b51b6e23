"""Sampling benchmark: read-back bytes per decode step, device path versus host path, and the host
cost of the per-batch decision.

Device path: the model samples on device and returns int32 tokens (plus one float32 logprob per
row when asked). Host path: the model returns float32 logits for vLLM's sampler. Bytes are taken
from real tensors of each path (the device side from the host reference ``sample_tokens``).

    python benchmarks/sampling_bench.py [--quick] [--batch 32] [--vocab 131072]

Writes benchmarks/results/sampling_bench.json and sampling_bench.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from report import write_results
from vllm import SamplingParams
from vllm_tt_sampling.decision import (
    DeviceSamplingCaps,
    DeviceSamplingMode,
    RowSampling,
    SamplingStats,
    choose_sampling_path,
    to_device_params,
)
from vllm_tt_sampling.device import sample_tokens
from vllm_tt_sampling.host import HostSamplingBatch
from vllm_tt_sampling.params import NO_LOGPROBS

RESULTS = Path(__file__).parent / "results"


def timed(fn: Callable[[], object], repeats: int) -> dict[str, float]:
    """Median and p90 wall time of ``fn`` in microseconds."""
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return {
        "median_us": statistics.median(samples),
        "p90_us": samples[int(0.9 * (len(samples) - 1))],
        "repeats": repeats,
    }


def typical_batch(batch: int) -> list[SamplingParams]:
    """A decode batch the device can serve: greedy, top-k/top-p, seeded and penalised rows."""
    kinds = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9),
        SamplingParams(temperature=1.0, top_k=32, seed=7),
        SamplingParams(temperature=0.7, top_k=10, presence_penalty=0.5, logprobs=0),
    ]
    return [kinds[i % len(kinds)] for i in range(batch)]


def readback_bytes(batch: int, vocab: int) -> dict[str, float]:
    logits = torch.randn(batch, vocab)
    wire = to_device_params(typical_batch(batch), vocab)
    positions = torch.arange(batch, dtype=torch.int64) + 100
    no_logprobs = dataclasses.replace(
        wire, num_logprobs=[NO_LOGPROBS] * batch, enable_log_probs=[False] * batch
    )
    tokens_only = sample_tokens(logits, no_logprobs, positions)
    with_logprobs = sample_tokens(logits, wire, positions)
    if tokens_only.logprobs is not None or with_logprobs.logprobs is None:
        raise RuntimeError("sample_tokens returned logprobs contrary to enable_log_probs")
    tokens_bytes = tokens_only.tokens.to(torch.int32).nbytes
    logprob_bytes = with_logprobs.tokens.to(torch.int32).nbytes + with_logprobs.logprobs.nbytes
    host_bytes = logits.to(torch.float32).nbytes
    return {
        "device_tokens_bytes": tokens_bytes,
        "device_tokens_and_logprob_bytes": logprob_bytes,
        "host_logits_bytes": host_bytes,
        "ratio_tokens": host_bytes / tokens_bytes,
        "ratio_tokens_and_logprob": host_bytes / logprob_bytes,
    }


def decision_cost(batch: int, repeats: int) -> dict[str, dict[str, float]]:
    params = typical_batch(batch)
    caps = DeviceSamplingCaps(max_top_k=32, penalties=True, max_logprobs=0)
    rows = [RowSampling.from_vllm(p, structured_output=False, intermediate_chunk=False) for p in params]
    stats = SamplingStats()

    def decide() -> None:
        stats.record(
            choose_sampling_path(
                rows, mode=DeviceSamplingMode.ALL, prefill=False, caps=caps, always_compat=False
            )
        )

    def views_and_decide() -> None:
        views = [RowSampling.from_vllm(p, structured_output=False, intermediate_chunk=False) for p in params]
        stats.record(
            choose_sampling_path(
                views, mode=DeviceSamplingMode.ALL, prefill=False, caps=caps, always_compat=False
            )
        )

    def wire_params() -> None:
        to_device_params(params, 131072)

    decision = choose_sampling_path(
        rows, mode=DeviceSamplingMode.ALL, prefill=False, caps=caps, always_compat=False
    )
    if decision.reason != "device":
        raise RuntimeError(f"benchmark batch should sample on device, got {decision}")
    return {
        "choose_sampling_path": timed(decide, repeats),
        "from_vllm_x_batch_plus_choose": timed(views_and_decide, repeats),
        "to_device_params": timed(wire_params, repeats),
    }


def sampler_cost(batch: int, vocab: int, repeats: int) -> dict[str, dict[str, float]]:
    """Host CPU time of one decode step on each path's host code, for context."""
    logits = torch.randn(batch, vocab)
    params = typical_batch(batch)
    wire = to_device_params(params, vocab)
    positions = torch.arange(batch, dtype=torch.int64)
    config = SimpleNamespace(  # the three fields HostSamplingBatch reads of a VllmConfig
        scheduler_config=SimpleNamespace(max_num_seqs=batch),
        model_config=None,
        speculative_config=None,
    )
    host = HostSamplingBatch(batch, vocab, config)  # type: ignore[arg-type]
    for slot, p in enumerate(params):
        gen = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        host.add_request(slot, f"r{slot}", p, [1, 2, 3], [], gen)
    slots = list(range(batch))
    return {
        "device_reference_sample_tokens": timed(lambda: sample_tokens(logits, wire, positions), repeats),
        "host_sampling_batch_sample": timed(lambda: host.sample(logits, slots), repeats),
    }


def markdown(result: dict) -> str:
    b, v = result["batch"], result["vocab"]
    rb = result["readback"]
    lines = [
        f"# Sampling benchmark (batch {b}, vocab {v})",
        "",
        f"Command: `{result['command']}`  ",
        f"Host: {result['host']}. Timings are wall-clock on whatever else the host runs; read them",
        "as orders of magnitude. Byte counts are exact.",
        "",
        "## Bytes read back per decode step",
        "",
        "| Path | Bytes | Host logits / path |",
        "|---|---:|---:|",
        f"| Host (float32 logits) | {rb['host_logits_bytes']:,} | 1x |",
        f"| Device (int32 tokens) | {rb['device_tokens_bytes']:,} | {rb['ratio_tokens']:,.0f}x |",
        f"| Device (tokens + float32 logprob) | {rb['device_tokens_and_logprob_bytes']:,} "
        f"| {rb['ratio_tokens_and_logprob']:,.0f}x |",
        "",
        f"## Host time per step (batch {b})",
        "",
        "| Operation | Median (us) | p90 (us) | Repeats |",
        "|---|---:|---:|---:|",
    ]
    for name, t in {**result["decision"], **result["sampler"]}.items():
        lines.append(f"| {name} | {t['median_us']:,.1f} | {t['p90_us']:,.1f} | {t['repeats']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke run)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=131072)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    decision_repeats, sampler_repeats = (500, 3) if args.quick else (20000, 10)
    command = "python benchmarks/sampling_bench.py" + (" --quick" if args.quick else "")
    if (args.batch, args.vocab) != (32, 131072):
        command += f" --batch {args.batch} --vocab {args.vocab}"
    result = {
        "command": command,
        "host": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads".replace("  ", " "),
        "batch": args.batch,
        "vocab": args.vocab,
        "readback": readback_bytes(args.batch, args.vocab),
        "decision": decision_cost(args.batch, decision_repeats),
        "sampler": sampler_cost(args.batch, args.vocab, sampler_repeats),
    }
    write_results(result, args.out / "sampling_bench.json", args.out / "sampling_bench.md", markdown(result))


if __name__ == "__main__":
    main()
