#!/usr/bin/env python
"""Pooling models on the modelled device clock: embeddings/s, p50/p99 latency and padding waste
of the fixed-shape pooling programs, against serving each request alone.

A pooling step runs its prompts whole at captured ``BATCHxLENGTH`` shapes
(``vllm_tt_platform.config.pooling_shapes``: grouped by the shortest length that holds them,
padded to the smallest batch that holds the group), one program per call, each taking the
device-time model's ``ProgramCosts.pool_s``. Requests arrive as a Poisson stream; a step takes
the waiting requests first come first served up to ``--max-num-seqs`` and vLLM's token budget, as
vLLM's scheduler admits them, and packed into calls as the runner packs them (by modelled
time). The baseline serves each request alone, in a ``1xL`` program of
the shortest length that holds it. Several request mixes and shape sets, so that the default
shape set is chosen from the measured waste. On a Galaxy it also compares one engine over the
whole mesh with the same mesh run as lanes (``--data-parallel-size``: every call runs its shape
on each lane's sub-mesh side by side, ``--max-num-seqs`` and the token budget per lane). No
model runs. Writes JSON and a markdown table.

    python benchmarks/pooling_bench.py            # full run (seconds)
    python benchmarks/pooling_bench.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from report import write_results  # noqa: E402

DEFAULT_JSON = REPO / "benchmarks" / "results" / "pooling_bench.json"
DEFAULT_MARKDOWN = REPO / "benchmarks" / "results" / "pooling_bench.md"
SCHEMA_VERSION = 1
COST_MODELS = ("bge-large@N150", "qwen3-embedding-8b@N150")
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 512
TOKEN_BUDGET = 2048
"""vLLM's default ``--max-num-batched-tokens`` of a pooling server (at least the longest shape)."""


@dataclass(frozen=True)
class Mix:
    """A request mix: the share of short queries and their lengths, the rest passages."""

    name: str
    query_share: float
    query_tokens: tuple[int, int] = (8, 64)
    passage_tokens: tuple[int, int] = (100, MAX_MODEL_LEN)


MIXES = (
    Mix("queries", 1.0),
    Mix("passages", 0.0),
    Mix("retrieval (70% queries)", 0.7),
)
SHAPE_SETS = {
    "default": None,  # batches 1, 2, 4, 8 x lengths 32, 64, 96, 128, 192, 256, 384, 512
    "doubling": ",".join(f"{b}x{n}" for n in (32, 64, 128, 256, 512) for b in (1, 2, 4, 8)),
    "coarse": "1x128,8x128,1x512,8x512",
}
"""The shape sets compared (``--additional-config.tt.pooling_shapes`` values): the default grid,
the grid of powers of two it replaced (the half-octave lengths 96, 192, 384 were chosen from
this benchmark's padding waste), and a coarse set of four programs."""
LANE_MODELS = ("bge-large@TG", "qwen3-embedding-8b@TG")
"""Cost models of the lanes comparison: one engine over the Galaxy's (8,4) mesh against lanes."""
LANE_COUNTS = (1, 4, 8)
LOADS = (0.5, 1.0, 2.0, 4.0)
"""Arrival rate as a multiple of what serving each request alone sustains (1.0 saturates it)."""


@dataclass(frozen=True)
class Plan:
    num_requests: int
    cost_models: tuple[str, ...]
    mixes: tuple[str, ...]
    shape_sets: tuple[str, ...]
    loads: tuple[float, ...]
    lane_models: tuple[str, ...] = ()
    lane_counts: tuple[int, ...] = LANE_COUNTS


FULL = Plan(2000, COST_MODELS, tuple(m.name for m in MIXES), tuple(SHAPE_SETS), LOADS, LANE_MODELS)
QUICK = Plan(60, COST_MODELS[:1], (MIXES[2].name,), ("default",), (1.0,), LANE_MODELS[:1], (1, 4))


def costs_of(spec: str, lanes: int = 1) -> Any:
    """The cost model ``spec`` (``model@preset``) of one of ``lanes`` equal sub-meshes."""
    from vllm_tt_platform.cost.device_time import MODEL_PROFILES, parse_device_time
    from vllm_tt_platform.mesh.shape import MESH_PRESETS

    parsed = parse_device_time(spec)
    assert parsed.mesh_preset is not None and parsed.model is not None
    return parsed.resolve(MODEL_PROFILES[parsed.model], MESH_PRESETS[parsed.mesh_preset], parsed.mesh_preset, lanes)


def prompt_lengths(mix: Mix, count: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(*(mix.query_tokens if rng.random() < mix.query_share else mix.passage_tokens))
            for _ in range(count)]


def arrivals(lengths: list[int], rate: float, seed: int = 1) -> list[float]:
    rng = random.Random(seed)
    clock, times = 0.0, []
    for _ in lengths:
        clock += rng.expovariate(rate)
        times.append(clock)
    return times


@dataclass
class Served:
    """One server's run over the trace."""

    latencies: list[float]
    makespan_s: float
    steps: int
    real_tokens: int
    padded_tokens: int
    per_shape: Counter[str]
    """Calls per shape."""
    shape_real: Counter[str]
    """Real (prompt) tokens per shape."""


def serve(lengths: list[int], times: list[float], shapes: Any, costs: Any, alone: bool, lanes: int = 1) -> Served:
    """Run the trace: each step takes waiting requests (one, ``alone``) first come first served
    up to ``MAX_NUM_SEQS`` and ``TOKEN_BUDGET`` per lane; its calls run one after the other,
    each on every lane's sub-mesh at once (``costs``: one sub-mesh's)."""
    clock, nxt, done = 0.0, 0, [0.0] * len(lengths)
    waiting: list[int] = []
    per_shape: Counter[str] = Counter()
    shape_real: Counter[str] = Counter()
    steps = real = padded = 0
    while nxt < len(lengths) or waiting:
        while nxt < len(lengths) and times[nxt] <= clock:
            waiting.append(nxt)
            nxt += 1
        if not waiting:
            clock = times[nxt]
            continue
        batch: list[int] = []
        budget = TOKEN_BUDGET * lanes
        for index in waiting:
            if len(batch) == (1 if alone else MAX_NUM_SEQS * lanes) or lengths[index] > budget:
                break
            batch.append(index)
            budget -= lengths[index]
        waiting = waiting[len(batch):]
        step_lengths = [lengths[i] for i in batch]
        for call in shapes.plan(step_lengths, lambda shape: costs.pool_s(shape.batch, shape.length), lanes):
            clock += costs.pool_s(call.shape.batch, call.shape.length)
            name = str(call.shape)
            per_shape[name] += 1
            tokens = sum(step_lengths[r] for r in call.rows)
            shape_real[name] += tokens
            real += tokens
            padded += call.batch * call.shape.length
        for index in batch:
            done[index] = clock
        steps += 1
    latencies = [end - start for end, start in zip(done, times, strict=True)]
    return Served(latencies, clock, steps, real, padded, per_shape, shape_real)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(served: Served, label: dict[str, Any], count: int) -> dict[str, Any]:
    return {
        **label,
        "embeddings_per_s": count / served.makespan_s,
        "latency_p50_ms": pct(served.latencies, 0.5) * 1e3,
        "latency_p99_ms": pct(served.latencies, 0.99) * 1e3,
        "latency_mean_ms": statistics.fmean(served.latencies) * 1e3,
        "steps": served.steps,
        "padding_waste": 1 - served.real_tokens / served.padded_tokens,
        "calls_per_shape": dict(served.per_shape),
        "waste_per_shape": {
            name: 1 - served.shape_real[name] / (calls * _tokens(name))
            for name, calls in served.per_shape.items()
        },
    }


def _tokens(shape: str) -> int:
    batch, _, length = shape.partition("x")
    return int(batch) * int(length)


def benchmark(plan: Plan) -> dict[str, Any]:
    from vllm_tt_platform.config.pooling_shapes import PoolingShapes

    rows: list[dict[str, Any]] = []
    mixes = {mix.name: mix for mix in MIXES}
    for model in plan.cost_models:
        costs = costs_of(model)
        for mix_name in plan.mixes:
            lengths = prompt_lengths(mixes[mix_name], plan.num_requests)
            default = PoolingShapes.resolve(None, MAX_NUM_SEQS, MAX_MODEL_LEN)
            alone_s = statistics.fmean(costs.pool_s(1, default.length_for(n)) for n in lengths)
            for load in plan.loads:
                times = arrivals(lengths, load / alone_s)
                label = {"cost_model": model, "mix": mix_name, "load": load}
                rows.append(row(serve(lengths, times, default, costs, alone=True),
                                {**label, "server": "alone", "shapes": "default"}, len(lengths)))
                for name in plan.shape_sets:
                    shapes = PoolingShapes.resolve(SHAPE_SETS[name], MAX_NUM_SEQS, MAX_MODEL_LEN)
                    rows.append(row(serve(lengths, times, shapes, costs, alone=False),
                                    {**label, "server": "batched", "shapes": name}, len(lengths)))
    return {"rows": versus_alone(rows), "lanes": lanes_rows(plan)}


def lanes_rows(plan: Plan) -> list[dict[str, Any]]:
    """Each lane model, mix and load: one engine over the whole mesh (1 lane) and the same mesh
    as lanes, default shapes, with throughput and p99 relative to the one engine. Loads are
    multiples of what the one engine serving each request alone sustains."""
    from vllm_tt_platform.config.pooling_shapes import PoolingShapes

    shapes = PoolingShapes.resolve(None, MAX_NUM_SEQS, MAX_MODEL_LEN)
    mixes = {mix.name: mix for mix in MIXES}
    rows: list[dict[str, Any]] = []
    for model in plan.lane_models:
        whole = costs_of(model)
        for mix_name in plan.mixes:
            lengths = prompt_lengths(mixes[mix_name], plan.num_requests)
            alone_s = statistics.fmean(whole.pool_s(1, shapes.length_for(n)) for n in lengths)
            for load in plan.loads:
                times = arrivals(lengths, load / alone_s)
                base: dict[str, Any] | None = None
                for lanes in plan.lane_counts:
                    served = serve(lengths, times, shapes, costs_of(model, lanes), alone=False, lanes=lanes)
                    r = row(served, {"cost_model": model, "mix": mix_name, "load": load, "lanes": lanes}, len(lengths))
                    base = base or r
                    r["throughput_vs_one_engine"] = r["embeddings_per_s"] / base["embeddings_per_s"]
                    r["p99_vs_one_engine"] = r["latency_p99_ms"] / base["latency_p99_ms"]
                    rows.append(r)
    return rows


def versus_alone(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each batched row with its throughput and p99 latency relative to the alone server."""
    alone = {(r["cost_model"], r["mix"], r["load"]): r for r in rows if r["server"] == "alone"}
    for r in rows:
        base = alone[(r["cost_model"], r["mix"], r["load"])]
        r["throughput_vs_alone"] = r["embeddings_per_s"] / base["embeddings_per_s"]
        r["p99_vs_alone"] = r["latency_p99_ms"] / base["latency_p99_ms"]
    return rows


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Pooling on the modelled device clock: {result['plan']['num_requests']} requests per run, Poisson "
        f"arrivals at a multiple of what serving each request alone sustains; up to {MAX_NUM_SEQS} prompts and "
        f"{TOKEN_BUDGET} tokens per step, --max-model-len {MAX_MODEL_LEN}. vLLM {result['vllm']}, "
        f"{result['seconds']:.0f} s. `{result['command']}`",
        "",
        "| cost model | mix | load | server | shapes | embeddings/s | p50 / p99 ms | padding waste "
        "| throughput vs alone | p99 vs alone |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['cost_model']} | {r['mix']} | {r['load']:g} | {r['server']} | {r['shapes']} "
            f"| {r['embeddings_per_s']:.0f} | {r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} "
            f"| {r['padding_waste']:.0%} | {r['throughput_vs_alone']:.2f}x | {r['p99_vs_alone']:.2f}x |"
        )
    lines += ["", "Padding waste per captured shape (the default set, batched, load 2, every mix pooled):", "",
              "| cost model | shape | calls | waste |", "|---|---|---|---|"]
    for model, shape, calls, waste in per_shape_waste(result["rows"]):
        lines.append(f"| {model} | {shape} | {calls} | {waste:.0%} |")
    lines += ["", "Lanes on a Galaxy (`--data-parallel-size N`: N lanes of (8,4)/N sub-meshes, up to "
              f"{MAX_NUM_SEQS} prompts and {TOKEN_BUDGET} tokens per step per lane; 1 lane = one engine over the "
              "whole mesh; default shapes; load as a multiple of what the one engine sustains serving each "
              "request alone):", "",
              "| cost model | mix | load | lanes | embeddings/s | p50 / p99 ms | padding waste "
              "| throughput vs one engine | p99 vs one engine |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["lanes"]:
        lines.append(
            f"| {r['cost_model']} | {r['mix']} | {r['load']:g} | {r['lanes']} | {r['embeddings_per_s']:.0f} "
            f"| {r['latency_p50_ms']:.1f} / {r['latency_p99_ms']:.1f} | {r['padding_waste']:.0%} "
            f"| {r['throughput_vs_one_engine']:.2f}x | {r['p99_vs_one_engine']:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def per_shape_waste(rows: list[dict[str, Any]]) -> list[tuple[str, str, int, float]]:
    """Calls and padding waste per shape of the default set, over every mix at load 2 (or the
    run's only load)."""
    loads = sorted({r["load"] for r in rows})
    load = 2.0 if 2.0 in loads else loads[-1]
    out = []
    for model in sorted({r["cost_model"] for r in rows}):
        calls: Counter[str] = Counter()
        padded: Counter[str] = Counter()
        wasted: Counter[str] = Counter()
        for r in rows:
            if (r["cost_model"], r["server"], r["shapes"], r["load"]) != (model, "batched", "default", load):
                continue
            for shape, count in r["calls_per_shape"].items():
                calls[shape] += count
                padded[shape] += count * _tokens(shape)
                wasted[shape] += count * _tokens(shape) * r["waste_per_shape"][shape]
        for shape in sorted(calls, key=lambda s: (int(s.partition("x")[2]), int(s.partition("x")[0]))):
            out.append((model, shape, calls[shape], wasted[shape] / padded[shape]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 60 requests, one mix and load")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--markdown", type=Path, default=DEFAULT_MARKDOWN)
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    started = time.perf_counter()
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "quick": args.quick, "plan": asdict(plan),
                              "command": "python benchmarks/pooling_bench.py" + (" --quick" if args.quick else "")}
    result.update(benchmark(plan))
    import vllm

    result["vllm"] = vllm.__version__
    result["seconds"] = time.perf_counter() - started
    write_results(result, args.json, args.markdown, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
