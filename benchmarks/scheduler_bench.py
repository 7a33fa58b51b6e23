#!/usr/bin/env python
"""Phase scheduler vs vLLM's stock scheduler on one synthetic request trace.

Measures (1) host cost per engine step, schedule() + update_from_output(), as the
ratio TT/stock over alternating runs, with and without KV pressure, and (2) mean
time-to-first-token and inter-token latency, in engine steps, for several
``prefill_burst`` values. No model runs: a fake runner samples tokens (see
``vllm_tt_scheduler.sim``). Writes JSON and a markdown table.

    python benchmarks/scheduler_bench.py            # full run (~4 min on 2 cores)
    python benchmarks/scheduler_bench.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "benchmarks" / "results" / "scheduler_bench.json"
DEFAULT_MARKDOWN = REPO / "benchmarks" / "results" / "scheduler_bench.md"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TraceSpec:
    """The synthetic workload."""

    num_requests: int = 2000
    prompt_min: int = 16
    prompt_max: int = 1024
    output_min: int = 8
    output_max: int = 256
    load: float = 0.9
    """Arrival rate as a fraction of the stock scheduler's decode capacity
    (running slots / mean output length, in requests per step)."""
    seed: int = 0


@dataclass(frozen=True)
class EngineSpec:
    """The engine both schedulers run with."""

    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    block_size: int = 64
    kv_fraction: float = 1.0
    """KV pool as a fraction of what every running slot at full length needs."""
    prefill_trace_max: int | None = None
    """Largest prefill trace the model declares: prompts are chunked to it (vLLM's
    stock scheduler gets the same per-request limit as long_prefill_token_threshold)."""

    def pool_blocks(self, trace: TraceSpec) -> int:
        longest = trace.prompt_max + trace.output_max
        per_seq = math.ceil(longest / self.block_size)
        return max(per_seq + 1, int(self.max_num_seqs * per_seq * self.kv_fraction) + 1)


@dataclass(frozen=True)
class Arrival:
    step: int
    req_id: str
    prompt_len: int
    output_len: int


def make_trace(spec: TraceSpec, max_num_seqs: int) -> list[Arrival]:
    """Poisson arrivals (in engine steps) near the stock scheduler's capacity."""
    rng = random.Random(spec.seed)
    mean_output = (spec.output_min + spec.output_max) / 2
    rate = spec.load * max_num_seqs / mean_output
    clock = 0.0
    arrivals = []
    for i in range(spec.num_requests):
        clock += rng.expovariate(rate)
        arrivals.append(
            Arrival(
                step=int(clock),
                req_id=f"r{i}",
                prompt_len=rng.randint(spec.prompt_min, spec.prompt_max),
                output_len=rng.randint(spec.output_min, spec.output_max),
            )
        )
    return arrivals


@dataclass(frozen=True)
class RunResult:
    scheduler: str
    prefill_burst: int | None
    steps: int
    host_us_per_step: float
    ttft_steps: float
    itl_steps: float
    prefill_steps: int
    decode_steps: int
    mixed_steps: int
    preemptions: int


def run_once(
    scheduler_name: str,
    trace: list[Arrival],
    engine: EngineSpec,
    trace_spec: TraceSpec,
    prefill_burst: int | None,
) -> RunResult:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_tt_scheduler import Phase, TTScheduler
    from vllm_tt_scheduler.sim import Engine, SimConfig, build_scheduler, make_request

    tt: dict[str, object] = {} if prefill_burst is None else {"prefill_burst": prefill_burst}
    if engine.prefill_trace_max is not None:
        tt["_prefill_trace_lens"] = [engine.prefill_trace_max]
    config = SimConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
        block_size=engine.block_size,
        num_blocks=engine.pool_blocks(trace_spec),
        long_prefill_token_threshold=engine.prefill_trace_max or 0,
        tt=tt,
    )
    cls = Scheduler if scheduler_name == "stock" else TTScheduler
    sim = Engine(build_scheduler(cls, config), strict_phases=cls is not Scheduler)
    counts = {Phase.PREFILL: 0, Phase.DECODE: 0, Phase.EMPTY: 0, None: 0}
    preemptions = 0
    pending = list(reversed(trace))
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        while pending or sim.has_work():
            while pending and pending[-1].step <= sim.step_index:
                arrival = pending.pop()
                sim.add(make_request(arrival.req_id, arrival.prompt_len, arrival.output_len))
            if not sim.has_work():
                sim.step_index += 1  # idle engine: time passes until the next arrival
                continue
            record = sim.step()
            if record is not None:
                counts[record.phase] += 1
                preemptions += len(record.preempted)
    finally:
        if gc_was_enabled:
            gc.enable()
    ttfts, gaps, intervals = [], 0, 0
    for log in sim.logs.values():
        if log.finishes != 1 or not log.token_steps:
            raise RuntimeError(f"request did not finish exactly once: {log}")
        ttfts.append(log.token_steps[0] - log.arrival_step + 1)
        gaps += log.token_steps[-1] - log.token_steps[0]
        intervals += len(log.token_steps) - 1
    host = sim.host
    return RunResult(
        scheduler=scheduler_name,
        prefill_burst=prefill_burst,
        steps=host.steps,
        host_us_per_step=(host.schedule + host.update) / host.steps * 1e6,
        ttft_steps=statistics.fmean(ttfts),
        itl_steps=gaps / intervals,
        prefill_steps=counts[Phase.PREFILL],
        decode_steps=counts[Phase.DECODE],
        mixed_steps=counts[None],
        preemptions=preemptions,
    )


def host_cost(trace: list[Arrival], engine: EngineSpec, spec: TraceSpec, pairs: int) -> dict[str, object]:
    """TT/stock host cost per step over alternating runs (stock first, then TT)."""
    ratios, runs = [], []
    for _ in range(pairs):
        stock = run_once("stock", trace, engine, spec, None)
        tt = run_once("tt", trace, engine, spec, None)
        ratios.append(tt.host_us_per_step / stock.host_us_per_step)
        runs += [asdict(stock), asdict(tt)]
    return {"ratio_median": statistics.median(ratios), "ratios": ratios, "runs": runs}


def latency(
    trace: list[Arrival], engine: EngineSpec, spec: TraceSpec, bursts: list[int]
) -> dict[str, object]:
    """Mean TTFT / ITL in steps: stock, then the TT scheduler for each burst value."""
    stock = run_once("stock", trace, engine, spec, None)
    rows = [asdict(stock)]
    for burst in bursts:
        tt = run_once("tt", trace, engine, spec, burst)
        row = asdict(tt)
        row["ttft_vs_stock"] = tt.ttft_steps / stock.ttft_steps
        rows.append(row)
    return {"rows": rows}


def markdown(result: dict) -> str:
    lines = [
        "| KV pool | host cost TT/stock per step (median of pairs) | pairs |",
        "|---|---|---|",
    ]
    for name, entry in result["host_cost"].items():
        ratios = ", ".join(f"{r:.2f}" for r in entry["ratios"])
        lines.append(f"| {name} | **{entry['ratio_median']:.2f}x** | {ratios} |")
    lines += [
        "",
        "| KV pool | scheduler | prefill_burst | mean TTFT (steps) | TTFT vs stock "
        "| mean ITL (steps) | steps | prefill / decode / mixed steps | preemptions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in result["latency"].items():
        for row in entry["rows"]:
            ratio = row.get("ttft_vs_stock")
            lines.append(
                f"| {name} | {row['scheduler']} | {row['prefill_burst'] or '-'} "
                f"| {row['ttft_steps']:.1f} | {'-' if ratio is None else f'{ratio:.2f}x'} "
                f"| {row['itl_steps']:.3f} | {row['steps']} "
                f"| {row['prefill_steps']} / {row['decode_steps']} / {row['mixed_steps']} "
                f"| {row['preemptions']} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small trace, 1 pair")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--markdown", type=Path, default=DEFAULT_MARKDOWN)
    parser.add_argument("--pairs", type=int, default=None, help="alternating host-cost pairs")
    parser.add_argument("--bursts", type=int, nargs="+", default=None)
    parser.add_argument("--load", type=float, default=None)
    args = parser.parse_args(argv)

    spec = TraceSpec(num_requests=120 if args.quick else 2000)
    if args.load is not None:
        spec = TraceSpec(num_requests=spec.num_requests, load=args.load)
    pairs = args.pairs or (1 if args.quick else 3)
    bursts = args.bursts or ([1, 2] if args.quick else [1, 2, 4, 8])
    engines = {
        "ample": EngineSpec(kv_fraction=1.0),
        "pressure": EngineSpec(kv_fraction=0.35),
    }
    started = time.perf_counter()
    trace = make_trace(spec, EngineSpec().max_num_seqs)
    result: dict = {
        "schema_version": SCHEMA_VERSION,
        "quick": args.quick,
        "trace": asdict(spec),
        "engines": {
            name: {**asdict(engine), "pool_blocks": engine.pool_blocks(spec)}
            for name, engine in engines.items()
        },
        "machine": {"python": sys.version.split()[0], "platform": platform.platform()},
        "host_cost": {},
        "latency": {},
    }
    for name, engine in engines.items():
        result["host_cost"][name] = host_cost(trace, engine, spec, pairs)
        result["latency"][name] = latency(trace, engine, spec, bursts)
    result["seconds"] = time.perf_counter() - started
    import vllm

    result["vllm"] = vllm.__version__
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(result)
    args.markdown.parent.mkdir(parents=True, exist_ok=True)
    args.markdown.write_text(table)
    print(table)
    print(f"wrote {args.json} and {args.markdown} in {result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
