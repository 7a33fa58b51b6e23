#!/usr/bin/env python
"""Phase scheduler (TTScheduler) vs vLLM's stock scheduler on synthetic request traces.

Measures (1) host cost per engine step, ``schedule()`` + ``update_from_output()``, as the
ratio TT/stock over alternating runs on the same trace, with and without KV pressure;
(2) mean time-to-first-token and inter-token latency in engine steps, for several
``prefill_burst`` and ``prefill_hold`` values and loads. No model runs: a fake runner
samples tokens (``vllm_tt_testing.scheduler_sim``). Writes JSON and a markdown table.

    python benchmarks/scheduler_bench.py            # full run (about 4 min on 2 cores)
    python benchmarks/scheduler_bench.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))  # also when loaded by file path (tests)
sys.path.insert(0, str(REPO / "testing"))  # vllm_tt_testing: the in-repo test support
from device_clock import StepCost  # noqa: E402
from report import write_results  # noqa: E402
from workload import Arrival, TraceDriver, TraceSpec, make_trace, run_alternating  # noqa: E402

DEFAULT_JSON = REPO / "benchmarks" / "results" / "scheduler_bench.json"
DEFAULT_MARKDOWN = REPO / "benchmarks" / "results" / "scheduler_bench.md"
SCHEMA_VERSION = 1


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
    """Largest prefill trace the model declares: the TT scheduler chunks prompts to it;
    the stock scheduler gets the same per-request limit (long_prefill_token_threshold)."""

    def pool_blocks(self, trace: TraceSpec) -> int:
        per_seq = math.ceil((trace.prompt_max + trace.output_max) / self.block_size)
        return max(per_seq + 1, int(self.max_num_seqs * per_seq * self.kv_fraction) + 1)


ENGINES = {
    "ample": EngineSpec(),
    "pressure": EngineSpec(kv_fraction=0.35),
    "trace256": EngineSpec(prefill_trace_max=256),
    "decode64": EngineSpec(max_num_seqs=64),  # disagg_bench's decode engine: both devices' slots on one
}


@dataclass(frozen=True)
class Run:
    """One scheduler over one trace: what to run."""

    engine: str
    load: float
    scheduler: str  # "stock" or "tt"
    prefill_burst: int | None = None
    prefill_hold: float | None = None
    step_cost: StepCost | None = None
    """``tt`` only: hand the scheduler this cost model (the cost-aware policy)."""
    mixed_shapes: tuple[tuple[int, int], ...] = ()
    """``tt`` only: the model runs mixed steps of these ``(decode rows, chunk tokens)`` shapes."""
    itl_slo_ms: float = 0.0
    """``tt`` with mixed shapes and a step cost: size mixed chunks to this ITL target (``tt.itl_slo_ms``)."""


@dataclass(frozen=True)
class RunResult:
    engine: str
    load: float
    scheduler: str
    prefill_burst: int | None
    prefill_hold: float | None
    steps: int
    host_us_per_step: float
    host_us_per_token: float
    ttft_steps: float
    itl_steps: float
    max_gap_steps: int
    """Longest wait between two tokens of one request (the worst decode stall)."""
    prefill_steps: int
    decode_steps: int
    mixed_steps: int
    preemptions: int


def simulated_engine(run: Run, spec: TraceSpec) -> Any:
    """The simulated engine (``vllm_tt_testing.scheduler_sim.Engine``) ``run`` asks for."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_tt_scheduler import TTScheduler, record_mixed_shapes, record_prefill_trace_lens
    from vllm_tt_scheduler.cost import record_step_cost
    from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler

    engine = ENGINES[run.engine]
    tt: dict[str, object] = {}
    if run.prefill_burst is not None:
        tt["prefill_burst"] = run.prefill_burst
    if run.prefill_hold is not None:
        tt["prefill_hold"] = run.prefill_hold
    if engine.prefill_trace_max is not None:
        record_prefill_trace_lens(tt, [engine.prefill_trace_max])
    if run.step_cost is not None:
        record_step_cost(tt, run.step_cost.scheduler_model())
    if run.mixed_shapes:
        record_mixed_shapes(tt, run.mixed_shapes)
    if run.itl_slo_ms:
        tt["itl_slo_ms"] = run.itl_slo_ms
    config = SimConfig(
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        max_model_len=engine.max_model_len,
        block_size=engine.block_size,
        num_blocks=engine.pool_blocks(spec),
        long_prefill_token_threshold=engine.prefill_trace_max or 0,
        tt=tt,
    )
    cls = Scheduler if run.scheduler == "stock" else TTScheduler
    return Engine(build_scheduler(cls, config), strict_phases=cls is not Scheduler)


class Driver(TraceDriver):
    """Feeds one trace to one scheduler, a few steps at a time."""

    def __init__(self, run: Run, trace: list[Arrival], spec: TraceSpec) -> None:
        self.run = run
        super().__init__(simulated_engine(run, spec), trace)

    def result(self) -> RunResult:
        from vllm_tt_scheduler import Phase

        times = self.token_times()
        host = self.sim.host
        host_us = (host.schedule + host.update) * 1e6
        run = self.run
        return RunResult(
            engine=run.engine,
            load=run.load,
            scheduler=run.scheduler,
            prefill_burst=run.prefill_burst,
            prefill_hold=run.prefill_hold,
            steps=host.steps,
            host_us_per_step=host_us / host.steps,
            host_us_per_token=host_us / times.tokens,
            ttft_steps=times.ttft_steps,
            itl_steps=times.itl_steps,
            max_gap_steps=times.max_gap_steps,
            prefill_steps=self.phases[Phase.PREFILL],
            decode_steps=self.phases[Phase.DECODE],
            mixed_steps=self.phases[None],
            preemptions=self.preemptions,
        )


def count_calls(run: Run, trace: list[Arrival], spec: TraceSpec) -> dict[str, float]:
    """Python function calls per engine step inside the two scheduler calls, by origin.

    Deterministic, unlike wall time on a shared machine: the same trace gives the same
    counts. The fake runner and this script are left out."""
    import cProfile
    import pstats

    driver = Driver(run, trace, spec)
    profile = cProfile.Profile()
    profile.enable()
    run_alternating([driver])
    profile.disable()
    calls = {"vllm": 0, "vllm_tt_scheduler": 0, "builtin": 0}
    for (path, _, _), (_, ncalls, *_) in pstats.Stats(profile).stats.items():  # type: ignore[attr-defined]
        if "vllm_tt_scheduler" in path:
            if not path.endswith(("sim.py", "phase.py")):  # the runner's side
                calls["vllm_tt_scheduler"] += ncalls
        elif path.endswith(("scheduler_bench.py", "workload.py")):
            continue
        elif f"{'/'}vllm{'/'}" in path:
            calls["vllm"] += ncalls
        else:
            calls["builtin"] += ncalls
    steps = driver.sim.host.steps
    return {origin: count / steps for origin, count in calls.items()}


@dataclass(frozen=True)
class Plan:
    """Which runs make up the benchmark."""

    num_requests: int
    host_load: float
    pairs: int
    loads: tuple[float, ...]
    holds: tuple[float, ...]
    hold_load: float
    bursts: tuple[int, ...]
    burst_load: float
    call_count_requests: int


FULL = Plan(2000, 0.9, 3, (0.6, 0.8, 1.0), (0.0, 0.15, 0.5, 1.0), 0.6, (1, 4), 0.6, 600)
QUICK = Plan(40, 0.9, 1, (), (0.0,), 0.9, (1,), 0.9, 20)


def benchmark(plan: Plan) -> dict[str, Any]:
    traces: dict[float, tuple[TraceSpec, list[Arrival]]] = {}

    def trace_for(load: float) -> tuple[TraceSpec, list[Arrival]]:
        if load not in traces:
            spec = TraceSpec(num_requests=plan.num_requests, load=load)
            traces[load] = (spec, make_trace(spec, EngineSpec().max_num_seqs))
        return traces[load]

    results: list[RunResult] = []

    def measure(run: Run) -> RunResult:
        spec, trace = trace_for(run.load)
        result = run_alternating([Driver(run, trace, spec)])[0]
        results.append(result)
        return result

    host_cost: dict[str, Any] = {}
    for engine in ("ample", "pressure"):
        spec, trace = trace_for(plan.host_load)
        ratios, token_ratios = [], []
        for pair in range(plan.pairs):
            runs = [Run(engine, plan.host_load, "stock"), Run(engine, plan.host_load, "tt")]
            if pair % 2:
                runs.reverse()  # alternate who goes first in each chunk
            by_name = {r.scheduler: r for r in run_alternating([Driver(r, trace, spec) for r in runs])}
            stock, tt = by_name["stock"], by_name["tt"]
            results += [stock, tt]
            ratios.append(tt.host_us_per_step / stock.host_us_per_step)
            token_ratios.append(tt.host_us_per_token / stock.host_us_per_token)
        host_cost[engine] = {
            "load": plan.host_load,
            "ratio_per_step_median": statistics.median(ratios),
            "ratios_per_step": ratios,
            "ratio_per_token_median": statistics.median(token_ratios),
        }
        calls_spec = TraceSpec(num_requests=plan.call_count_requests, load=plan.host_load)
        calls_trace = make_trace(calls_spec, EngineSpec().max_num_seqs)
        calls = {
            name: count_calls(Run(engine, plan.host_load, name), calls_trace, calls_spec)
            for name in ("stock", "tt")
        }
        host_cost[engine]["calls_per_step"] = calls
        host_cost[engine]["calls_ratio"] = sum(calls["tt"].values()) / sum(calls["stock"].values())
    for load in plan.loads:
        measure(Run("ample", load, "stock"))
        measure(Run("ample", load, "tt"))
    for hold in plan.holds:
        measure(Run("ample", plan.hold_load, "tt", prefill_hold=hold))
    for burst in plan.bursts:
        measure(Run("ample", plan.burst_load, "tt", prefill_burst=burst))
    measure(Run("trace256", plan.burst_load, "stock"))
    for burst in sorted({*plan.bursts, 2, 8} if plan is FULL else {*plan.bursts}):
        measure(Run("trace256", plan.burst_load, "tt", prefill_burst=burst))

    latency = _latency_rows(results)
    return {
        "host_cost": host_cost, "latency": latency,
        "runs": [asdict(r) for r in results],
    }


def _latency_rows(results: list[RunResult]) -> list[dict[str, Any]]:
    """One row per distinct (engine, load, scheduler, knobs), TTFT relative to stock."""
    from vllm_tt_scheduler import DEFAULT_PREFILL_BURST, DEFAULT_PREFILL_HOLD

    rows: dict[tuple[object, ...], dict[str, Any]] = {}
    for result in results:
        burst = hold = None
        if result.scheduler == "tt":
            burst = result.prefill_burst or DEFAULT_PREFILL_BURST
            hold = DEFAULT_PREFILL_HOLD if result.prefill_hold is None else result.prefill_hold
        key = (result.engine, result.load, result.scheduler, burst, hold)
        if key not in rows:  # repeated host-cost runs give identical latencies
            rows[key] = {**asdict(result), "prefill_burst": burst, "prefill_hold": hold}
    stock = {(r["engine"], r["load"]): r for r in rows.values() if r["scheduler"] == "stock"}
    for row in rows.values():
        base = stock.get((row["engine"], row["load"]))
        row["ttft_vs_stock"] = row["ttft_steps"] / base["ttft_steps"] if base else None
        for field in ("host_us_per_step", "host_us_per_token"):
            row.pop(field)
    return sorted(rows.values(), key=lambda r: (r["engine"], r["load"], r["scheduler"] == "tt"))


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Trace: {result['trace']['num_requests']} requests, prompts "
        f"{result['trace']['prompt_min']}-{result['trace']['prompt_max']}, outputs "
        f"{result['trace']['output_min']}-{result['trace']['output_max']} tokens, Poisson "
        "arrivals; 32 running slots, 2048-token step budget. vLLM "
        f"{result['vllm']}, {result['seconds']:.0f} s.",
        "",
        "| KV pool | load | host cost TT/stock per step (median) | per step, each pair "
        "| per generated token (median) | Python calls per step, stock -> TT (vLLM + own) "
        "| calls TT/stock |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, entry in result["host_cost"].items():
        pairs = ", ".join(f"{r:.2f}" for r in entry["ratios_per_step"])
        stock, tt = entry["calls_per_step"]["stock"], entry["calls_per_step"]["tt"]
        lines.append(
            f"| {name} | {entry['load']} | **{entry['ratio_per_step_median']:.2f}x** | {pairs} "
            f"| {entry['ratio_per_token_median']:.2f}x "
            f"| {sum(stock.values()):.0f} -> {sum(tt.values()):.0f} "
            f"({tt['vllm']:.0f} + {tt['vllm_tt_scheduler']:.0f}) | {entry['calls_ratio']:.3f} |"
        )
    lines += [
        "",
        "| engine | load | scheduler | prefill_burst | prefill_hold | mean TTFT (steps) "
        "| TTFT vs stock | mean ITL (steps) | max gap | steps | prefill / decode / mixed "
        "| preemptions |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["latency"]:
        ratio = row["ttft_vs_stock"]
        knob = lambda v: "-" if v is None else f"{v:g}"  # noqa: E731
        lines.append(
            f"| {row['engine']} | {row['load']} | {row['scheduler']} | {knob(row['prefill_burst'])} "
            f"| {knob(row['prefill_hold'])} | {row['ttft_steps']:.1f} "
            f"| {'-' if row['scheduler'] == 'stock' or ratio is None else f'{ratio:.2f}x'} "
            f"| {row['itl_steps']:.3f} | {row['max_gap_steps']} | {row['steps']} "
            f"| {row['prefill_steps']} / {row['decode_steps']} / {row['mixed_steps']} "
            f"| {row['preemptions']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 40 requests, few runs")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--markdown", type=Path, default=DEFAULT_MARKDOWN)
    parser.add_argument("--requests", type=int, default=None, help="override the trace length")
    args = parser.parse_args(argv)

    plan = QUICK if args.quick else FULL
    if args.requests is not None:
        plan = replace(plan, num_requests=args.requests)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "quick": args.quick,
        "trace": asdict(TraceSpec(num_requests=plan.num_requests)),
        "engines": {
            name: {**asdict(engine), "pool_blocks": engine.pool_blocks(TraceSpec())}
            for name, engine in ENGINES.items()
        },
        "plan": asdict(plan),
    }
    result.update(benchmark(plan))
    import vllm

    result["vllm"] = vllm.__version__
    result["machine"] = {"python": sys.version.split()[0], "platform": platform.platform()}
    result["seconds"] = time.perf_counter() - started
    write_results(result, args.json, args.markdown, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
