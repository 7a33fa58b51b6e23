#!/usr/bin/env python
"""The phase scheduler on a modelled device clock: what users feel, stock vLLM against the
step-counted policy (the default), the cost-aware policy (``tt.step_cost``) and mixed steps
(``tt.mixed_steps``, a model declaring ``mixed_shapes``), plain and with the SLO-aware chunk
policy (``tt.itl_slo_ms``).

Every engine step takes the time the host backend's device-time model gives it, for two cost
models (Llama-3.1-8B on an N150, Llama-3.3-70B on a Galaxy); vLLM's stock scheduler's mixed steps
are costed on the same roofline, as if a mesh could run them. Reports mean and p99 TTFT and ITL in
ms, goodput (both SLOs met, ``device_clock``), the step mix and host cost per step, at loads
0.5-1.0 with ample KV and under KV pressure, plus the step-counted policy's ``prefill_hold``
frontier. No model runs (``vllm_tt_testing.scheduler_sim``). Writes JSON and a markdown table.

    python benchmarks/clock_bench.py            # full run
    python benchmarks/clock_bench.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))  # also when loaded by file path (tests)
sys.path.insert(0, str(REPO / "testing"))
from device_clock import (  # noqa: E402
    COST_MODELS,
    SLO_ITL_STEPS,
    SLO_TTFT_STEPS,
    StepCost,
    TimedDriver,
    clock_parser,
    narrowed,
    timed_markdown,
    versus_stock,
)
from report import recorded, write_results  # noqa: E402
from scheduler_bench import ENGINES, EngineSpec, Run, simulated_engine  # noqa: E402
from workload import TraceSpec, make_trace, run_alternating  # noqa: E402

DEFAULT_JSON = REPO / "benchmarks" / "results" / "clock_bench.json"
DEFAULT_MARKDOWN = REPO / "benchmarks" / "results" / "clock_bench.md"
SCHEMA_VERSION = 1
TARGET_LOADS = (0.6, 0.7, 0.8, 0.9)
"""The issue's targets hold here, with ample KV: TTFT <= 1.5x, ITL <= 1.10x, goodput >= 0.9x stock."""
MIXED_CHUNKS = (128, 192, 256, 512, 1024, 2048)
"""The chunk lengths of the ``tt-mixed`` rows' captured mixed programs, each beside a full decode
batch; a mixed step is costed as stock's mixed steps are (``ProgramCosts.mixed_s``: one weight
stream, every token's compute). 128 and 192 are the chunks a step of either cost model runs within
the ITL SLO, for the SLO-aware policy (``tt-mixed-slo``, ``tt.itl_slo_ms`` at the goodput SLO)."""
MIXED_TARGETS = {
    "tt-mixed": ((0.5, 0.6, 0.7, 0.8, 0.9, 1.0), {"ttft": 1.05, "itl": 1.03}, 0.97),
    "tt-mixed-slo": ((0.9, 1.0), {}, 1.1),
}
"""Mixed steps' targets, ample KV: loads, the most TTFT / ITL may be relative to stock, the least
goodput relative to stock."""


@dataclass(frozen=True)
class Plan:
    num_requests: int
    cost_models: tuple[str, ...]
    engines: tuple[str, ...]
    loads: tuple[float, ...]
    frontier_loads: tuple[float, ...]
    holds: tuple[float, ...]
    """The step-counted policy's ``prefill_hold`` frontier, with ample KV at ``frontier_loads``."""


FULL = Plan(400, COST_MODELS, ("ample", "pressure"), (0.5, 0.6, 0.7, 0.8, 0.9, 1.0), TARGET_LOADS, (0.0, 0.15, 1.0))
QUICK = Plan(30, COST_MODELS, ("ample",), (0.9,), (), ())


def label(run: Run, model: str) -> dict[str, Any]:
    from vllm_tt_scheduler import DEFAULT_PREFILL_HOLD

    scheduler = run.scheduler if run.scheduler == "stock" else (
        "tt-mixed-slo" if run.itl_slo_ms else "tt-mixed" if run.mixed_shapes
        else "tt-cost" if run.step_cost else "tt-steps")
    hold = None
    if scheduler == "tt-steps":
        hold = DEFAULT_PREFILL_HOLD if run.prefill_hold is None else run.prefill_hold
    return {"cost_model": model, "engine": run.engine, "load": run.load, "scheduler": scheduler, "prefill_hold": hold}


def benchmark(plan: Plan) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for model in plan.cost_models:
        cost = StepCost.of(model)
        for engine in plan.engines:
            for load in plan.loads:
                spec = TraceSpec(num_requests=plan.num_requests, load=load)
                trace = make_trace(spec, EngineSpec().max_num_seqs)
                mixed = tuple((ENGINES[engine].max_num_seqs, chunk) for chunk in MIXED_CHUNKS)
                slo_ms = SLO_ITL_STEPS * cost.slo_unit_s(spec, ENGINES[engine].max_num_seqs) * 1e3
                runs = [Run(engine, load, "stock"), Run(engine, load, "tt"), Run(engine, load, "tt", step_cost=cost),
                        Run(engine, load, "tt", mixed_shapes=mixed),
                        Run(engine, load, "tt", step_cost=cost, mixed_shapes=mixed, itl_slo_ms=slo_ms)]
                if engine == "ample" and load in plan.frontier_loads:
                    runs += [Run(engine, load, "tt", prefill_hold=hold) for hold in plan.holds]
                rows_per_step = ENGINES[engine].max_num_seqs
                drivers = [TimedDriver(simulated_engine(run, spec), label(run, model), trace, spec, cost, rows_per_step)
                           for run in runs]
                rows += [asdict(result) for result in run_alternating(drivers)]
    return {"slo": {"ttft_decode_steps": SLO_TTFT_STEPS, "itl_decode_steps": SLO_ITL_STEPS},
            "cost_models": list(plan.cost_models), "rows": versus_stock(rows), "targets": targets(rows),
            "mixed_targets": mixed_targets(rows)}


def targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets for each TT policy, cost model and load in ``TARGET_LOADS`` (ample KV)."""
    checks = []
    for row in rows:
        if row["engine"] != "ample" or row["load"] not in TARGET_LOADS or row["scheduler"] == "stock":
            continue
        if row["scheduler"] == "tt-steps" and row["prefill_hold"] not in (None, _default_hold()):
            continue
        ttft, itl, good = row["ttft_mean_ms_vs_stock"], row["itl_mean_ms_vs_stock"], row["goodput_vs_stock"]
        checks.append({
            "cost_model": row["cost_model"], "load": row["load"], "scheduler": row["scheduler"],
            "ttft_ok": ttft <= 1.5, "itl_ok": itl <= 1.10, "goodput_ok": good is not None and good >= 0.9,
        })
    return checks


def mixed_targets(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``MIXED_TARGETS`` for each mixed row (ample KV) at its loads: each bound, met or not."""
    checks = []
    for row in rows:
        loads, most, least_goodput = MIXED_TARGETS.get(row["scheduler"], ((), {}, 0.0))
        if row["engine"] != "ample" or row["load"] not in loads:
            continue
        bounds = {name: row[f"{name}_mean_ms_vs_stock"] <= bound for name, bound in most.items()}
        good = row["goodput_vs_stock"]
        checks.append({"cost_model": row["cost_model"], "load": row["load"], "scheduler": row["scheduler"],
                       **{f"{name}_ok": ok for name, ok in bounds.items()},
                       "goodput_ok": good is not None and good >= least_goodput})
    return checks


def _default_hold() -> float:
    from vllm_tt_scheduler import DEFAULT_PREFILL_HOLD

    return DEFAULT_PREFILL_HOLD


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"Trace: {result['trace']['num_requests']} requests per run, prompts {result['trace']['prompt_min']}-"
        f"{result['trace']['prompt_max']}, outputs {result['trace']['output_min']}-{result['trace']['output_max']} "
        "tokens, Poisson arrivals; 32 running slots, 2048-token step budget; KV pools as in scheduler_bench "
        f"(ample, pressure: 35%). vLLM {result['vllm']}, {result['seconds']:.0f} s.",
        "",
        *timed_markdown(result),
        "Targets at loads 0.6-0.9, ample KV (TTFT <= 1.5x, ITL <= 1.10x, goodput >= 0.9x stock):",
        "",
        "| cost model | load | scheduler | TTFT | ITL | goodput |",
        "|---|---|---|---|---|---|",
    ]
    mark = lambda ok: "met" if ok else "missed"  # noqa: E731
    for check in result["targets"]:
        lines.append(f"| {check['cost_model']} | {check['load']} | {check['scheduler']} | {mark(check['ttft_ok'])} "
                     f"| {mark(check['itl_ok'])} | {mark(check['goodput_ok'])} |")
    lines += ["", "Mixed steps' targets, ample KV (`tt-mixed` at loads 0.5-1.0: TTFT <= 1.05x, ITL <= 1.03x, "
              "goodput >= 0.97x stock; `tt-mixed-slo` at 0.9-1.0: goodput >= 1.1x stock):", "",
              "| cost model | load | scheduler | TTFT | ITL | goodput |", "|---|---|---|---|---|---|"]
    for check in result["mixed_targets"]:
        ttft, itl = (mark(check[name]) if name in check else "-" for name in ("ttft_ok", "itl_ok"))
        lines.append(f"| {check['cost_model']} | {check['load']} | {check['scheduler']} | {ttft} | {itl} "
                     f"| {mark(check['goodput_ok'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = clock_parser(__doc__ or "", "smoke run: 30 requests, one load", DEFAULT_JSON, DEFAULT_MARKDOWN,
                          "run these loads only (and no prefill_hold frontier)")
    parser.add_argument("--engine", choices=("ample", "pressure"), default=None, help="run one KV pool only")
    args = parser.parse_args(argv)
    plan = narrowed(QUICK if args.quick else FULL, args)
    if args.engine is not None:
        plan = replace(plan, engines=(args.engine,))
    if args.loads is not None:
        plan = replace(plan, frontier_loads=())
    result = recorded({"schema_version": SCHEMA_VERSION, "quick": args.quick,
                       "trace": asdict(TraceSpec(num_requests=plan.num_requests)), "plan": asdict(plan)},
                      lambda: benchmark(plan))
    write_results(result, args.json, args.markdown, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
