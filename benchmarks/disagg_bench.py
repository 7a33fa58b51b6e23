#!/usr/bin/env python
"""Disaggregated prefill/decode against co-located engines, on the modelled device clock.

Two devices of one cost model (Llama-3.1-8B on N150s, Llama-3.3-70B on Galaxies), one trace, the
clock bench's SLOs (``device_clock``):

* **co-located**: two engines, one per device, each its own clock; each request goes to the less
  loaded one (waiting + running, as vLLM's data-parallel load balancer scores them). vLLM's stock
  scheduler (the reference), the TT phase scheduler's step-counted policy and its cost-aware one.
* **disaggregated**: a prefill engine computes each prompt and its first token (TTFT ends there)
  and stores the prompt's KV; the request joins the decode engine on the other device once its KV
  is there. As vLLM's ``ExampleConnector`` does it, the decode engine loads the prompt's whole
  blocks before its last token and recomputes the rest (a prefill row of at most one block, with
  the loaded blocks cached before it), then decodes. Both engines run the TT phase scheduler.

KV transfer, as the TT worker side of the connector queues it: the store (device to host) after the
forward that computed the prompt, on the prefill engine's clock; the load (host to device) before
the forward that reads it, on the decode engine's clock; each costs ``ProgramCosts.kv_transfer_s``
of the blocks (the host link). What lies between the two hosts (a shared file system, a network) is
not modelled. No model runs (``vllm_tt_testing.scheduler_sim``). Writes JSON and a markdown table.

    python benchmarks/disagg_bench.py            # full run
    python benchmarks/disagg_bench.py --quick    # smoke run (seconds)
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))  # also when loaded by file path (tests)
sys.path.insert(0, str(REPO / "testing"))
from clock_bench import MIXED_CHUNKS  # noqa: E402
from device_clock import (  # noqa: E402
    COST_MODELS,
    SLO_ITL_STEPS,
    SLO_TTFT_STEPS,
    StepCost,
    TimedDriver,
    clock_heading,
    clock_parser,
    latencies,
    narrowed,
)
from report import recorded, write_results  # noqa: E402
from scheduler_bench import ENGINES, Run, simulated_engine  # noqa: E402
from workload import Arrival, TraceSpec, make_trace  # noqa: E402

DEFAULT_JSON = REPO / "benchmarks" / "results" / "disagg_bench.json"
DEFAULT_MARKDOWN = REPO / "benchmarks" / "results" / "disagg_bench.md"
SCHEMA_VERSION = 1
COLOCATED = "ample"
"""Each co-located engine, and the prefill engine: 32 running slots, 2048-token steps, ample KV."""
DECODE = "decode64"
"""The decode engine: the two devices' 64 running slots on the one device that only decodes."""
ROWS = ENGINES[COLOCATED].max_num_seqs
"""Rows of the SLO unit and of a trace step, as in the clock bench (one device's batch)."""
BLOCK = ENGINES[COLOCATED].block_size
TARGET = ("llama-3.1-8b@N150", 0.8, 1.3)
"""The issue's target: disaggregated goodput >= 1.3x co-located at load 0.8 on the 8B@N150 preset."""


@dataclass(frozen=True)
class Setup:
    """How the two devices serve: ``policy`` is ``stock``, ``tt-steps`` (the step-counted policy),
    ``tt-cost`` (the cost-aware one) or ``tt-mixed`` (the step-counted policy with a model's
    captured mixed steps, ``clock_bench.MIXED_CHUNKS`` beside a full decode batch)."""

    policy: str
    disaggregated: bool = False

    @property
    def name(self) -> str:
        return f"disagg-{self.policy}" if self.disaggregated else self.policy

    def run(self, engine: str, load: float, cost: StepCost) -> Run:
        if self.policy == "stock":
            return Run(engine, load, "stock")
        mixed = tuple((ENGINES[engine].max_num_seqs, chunk) for chunk in MIXED_CHUNKS)
        return Run(engine, load, "tt", step_cost=cost if self.policy == "tt-cost" else None,
                   mixed_shapes=mixed if self.policy == "tt-mixed" else ())


SETUPS = (*(Setup(policy) for policy in ("stock", "tt-steps", "tt-cost", "tt-mixed")),
          *(Setup(policy, True) for policy in ("tt-steps", "tt-cost", "tt-mixed")))


def loaded_tokens(prompt_len: int) -> int:
    """The prompt tokens a decode engine loads: the whole blocks before the last token."""
    return (prompt_len - 1) // BLOCK * BLOCK


class PrefillDriver(TimedDriver):
    """The prefill engine: each completed prompt's store adds its host-link time to the step."""

    def stepped(self, record: Any) -> None:
        before = dict(self.computed)
        super().stepped(record)
        stores = [req_id for req_id, tokens in record.scheduled.items()
                  if before.get(req_id, 0) + tokens == self.prompts[req_id]]
        self.clock += sum(self.cost.costs.kv_transfer_s(loaded_tokens(self.prompts[r])) for r in stores
                          if loaded_tokens(self.prompts[r]))
        self.ends[record.index] = self.clock


class DecodeDriver(TimedDriver):
    """The decode engine: a request arrives when its KV is stored (``ready``, seconds) as its
    prompt's tail, which is what vLLM's scheduler schedules once the connector reports the loaded
    blocks as computed; the clock costs every row with its whole context and adds each load's
    host-link time to the step that schedules it. The scheduler's block accounting leaves the
    loaded blocks out, which changes no decision in an ample pool."""

    def __init__(self, sim: Any, trace: list[Arrival], prompts: dict[str, int], ready: dict[str, float],
                 spec: TraceSpec, cost: StepCost) -> None:
        super().__init__(sim, {}, trace, spec, cost, ROWS)
        self.ready = ready
        self.prompts = prompts
        self.computed = {req_id: loaded_tokens(length) for req_id, length in prompts.items()}
        self.to_load = {req_id for req_id in prompts if self.computed[req_id]}

    def due(self, arrival: Arrival) -> bool:
        return self.ready[arrival.req_id] <= self.clock

    def idle(self, upcoming: Arrival) -> None:
        self.clock = self.ready[upcoming.req_id]

    def stepped(self, record: Any) -> None:
        loads = self.to_load.intersection(record.scheduled)
        self.to_load -= loads
        super().stepped(record)
        self.clock += sum(self.cost.costs.kv_transfer_s(self.computed[r] - record.scheduled[r]) for r in loads)
        self.ends[record.index] = self.clock


def least_loaded(drivers: list[TimedDriver], trace: list[Arrival], unit: float) -> None:
    """Serve ``trace`` on co-located ``drivers``: each engine runs on its own clock up to an
    arrival, which goes to the engine with the fewest waiting + running requests (ties rotate)."""
    for index, arrival in enumerate(trace):
        for driver in drivers:
            while driver.clock < arrival.step * unit and (driver.pending or driver.sim.has_work()):
                driver.advance(1)
        order = drivers[index % len(drivers):] + drivers[:index % len(drivers)]
        min(order, key=lambda d: sum(d.sim.scheduler.get_request_counts()) + len(d.pending)).pending.insert(0, arrival)
    for driver in drivers:
        while not driver.done:
            driver.advance(64)


def colocated(setup: Setup, load: float, spec: TraceSpec, trace: list[Arrival], cost: StepCost) -> dict[str, Any]:
    drivers = [TimedDriver(simulated_engine(setup.run(COLOCATED, load, cost), spec), {}, trace, spec, cost, ROWS)
               for _ in range(2)]
    for driver in drivers:
        driver.pending = []
    least_loaded(drivers, trace, drivers[0].unit)
    times = {req_id: t for driver in drivers for req_id, t in driver.token_times_s().items()}
    return {**latencies(drivers[0].arrived, times, drivers[0].slo_unit),
            "engines": [engine_row(f"co-located {i}", driver) for i, driver in enumerate(drivers)]}


def disaggregated(setup: Setup, load: float, spec: TraceSpec, trace: list[Arrival], cost: StepCost) -> dict[str, Any]:
    prompts = [replace(arrival, output_len=1) for arrival in trace]
    prefill = PrefillDriver(simulated_engine(setup.run(COLOCATED, load, cost), spec), {}, prompts, spec, cost, ROWS)
    while not prefill.done:
        prefill.advance(64)
    first = {req_id: times[0] for req_id, times in prefill.token_times_s().items()}
    tails = sorted((replace(a, prompt_len=a.prompt_len - loaded_tokens(a.prompt_len)) for a in trace),
                   key=lambda a: first[a.req_id])
    decode = DecodeDriver(simulated_engine(setup.run(DECODE, load, cost), spec), tails,
                          {a.req_id: a.prompt_len for a in trace}, first, spec, cost)
    while not decode.done:
        decode.advance(64)
    times = {req_id: [first[req_id], *rest[1:]] for req_id, rest in decode.token_times_s().items()}
    return {**latencies(prefill.arrived, times, prefill.slo_unit),
            "engines": [engine_row("prefill", prefill), engine_row("decode", decode)]}


def engine_row(role: str, driver: TimedDriver) -> dict[str, Any]:
    return {"role": role, "requests": len(driver.sim.logs), **driver.step_mix(), "preemptions": driver.preemptions}


@dataclass(frozen=True)
class Plan:
    num_requests: int
    cost_models: tuple[str, ...]
    loads: tuple[float, ...]


FULL = Plan(400, COST_MODELS, (0.6, 0.7, 0.8, 0.9, 1.0))
QUICK = Plan(30, COST_MODELS, (0.8,))


def benchmark(plan: Plan) -> dict[str, Any]:
    rows = []
    for model in plan.cost_models:
        cost = StepCost.of(model)
        for load in plan.loads:
            spec = TraceSpec(num_requests=plan.num_requests, load=load)
            trace = make_trace(spec, 2 * ROWS)  # the load of both devices
            for setup in SETUPS:
                serve = disaggregated if setup.disaggregated else colocated
                rows.append({"cost_model": model, "load": load, "setup": setup.name, "policy": setup.policy,
                             "disaggregated": setup.disaggregated,
                             "slo_unit_ms": cost.slo_unit_s(spec, ROWS) * 1e3,
                             **serve(setup, load, spec, trace, cost)})
    ratios(rows)
    return {"slo": {"ttft_decode_steps": SLO_TTFT_STEPS, "itl_decode_steps": SLO_ITL_STEPS},
            "cost_models": list(plan.cost_models), "rows": rows, "crossover": crossover(rows),
            "target": target(rows)}


def ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's TTFT, ITL and goodput relative to co-located stock and to co-located TT of the
    same policy (``None`` where the base is the row itself or zero)."""
    by = {(r["cost_model"], r["load"], r["setup"]): r for r in rows}
    for row in rows:
        for base_name, suffix in (("stock", "vs_stock"), (row["policy"], "vs_colocated")):
            base = by[(row["cost_model"], row["load"], base_name)]
            for field in ("ttft_mean_ms", "itl_mean_ms", "goodput"):
                row[f"{field}_{suffix}"] = None if row is base or not base[field] else row[field] / base[field]


def crossover(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cost model and disaggregated setup: the first load where its goodput exceeds
    co-located goodput of the same policy."""
    goodput = {(r["cost_model"], r["load"], r["setup"]): r["goodput"] for r in rows}
    found = []
    for model in dict.fromkeys(r["cost_model"] for r in rows):
        loads = sorted({r["load"] for r in rows if r["cost_model"] == model})
        for setup in (s for s in SETUPS if s.disaggregated):
            first = next((load for load in loads
                          if goodput[(model, load, setup.name)] > goodput[(model, load, setup.policy)]), None)
            found.append({"cost_model": model, "setup": setup.name, "load": first, "loads": loads})
    return found


def target(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's target for each disaggregated setup, where the plan ran its cost model and load."""
    model, load, least = TARGET
    return [{"cost_model": model, "load": load, "setup": r["setup"], "goodput": r["goodput"],
             "goodput_vs_colocated": r["goodput_vs_colocated"], "least": least,
             "met": r["goodput_vs_colocated"] is not None and r["goodput_vs_colocated"] >= least}
            for r in rows if r["disaggregated"] and r["cost_model"] == model and r["load"] == load]


def markdown(result: dict[str, Any]) -> str:
    trace, slo = result["trace"], result["slo"]
    lines = [
        f"Trace: {trace['num_requests']} requests per run, prompts {trace['prompt_min']}-{trace['prompt_max']}, "
        f"outputs {trace['output_min']}-{trace['output_max']} tokens, Poisson arrivals at the load of two devices "
        f"(64 running slots); co-located: 2 engines of 32 slots; disaggregated: a prefill engine of 32 slots and "
        f"a decode engine of 64; 2048-token steps, {BLOCK}-token blocks, ample KV. vLLM {result['vllm']}, "
        f"{result['seconds']:.0f} s.",
        "",
    ]
    ratio = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    for model in result["cost_models"]:
        rows = [r for r in result["rows"] if r["cost_model"] == model]
        lines += [
            *clock_heading(model, rows[0]["slo_unit_ms"], slo),
            "| load | setup | TTFT mean / p99 (ms) | ITL mean / p99 (ms) | goodput | goodput vs co-located TT "
            "| vs stock | TTFT vs co-located TT | ITL vs co-located TT | steps per engine: prefill / decode / mixed |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            mix = "; ".join(f"{e['role']}: {e['prefill_steps']} / {e['decode_steps']} / {e['mixed_steps']}"
                            for e in r["engines"])
            lines.append(
                f"| {r['load']} | {r['setup']} | {r['ttft_mean_ms']:.0f} / {r['ttft_p99_ms']:.0f} "
                f"| {r['itl_mean_ms']:.1f} / {r['itl_p99_ms']:.0f} | {r['goodput']:.2f} "
                f"| {ratio(r['goodput_vs_colocated'])} | {ratio(r['goodput_vs_stock'])} "
                f"| {ratio(r['ttft_mean_ms_vs_colocated'])} | {ratio(r['itl_mean_ms_vs_colocated'])} | {mix} |")
        lines.append("")
    lines += ["Crossover (the first load where disaggregated goodput exceeds co-located, same policy):", ""]
    for c in result["crossover"]:
        where = "none" if c["load"] is None else f"load {c['load']:g}"
        lines.append(f"- {c['cost_model']}, {c['setup']}: {where} (loads run: {', '.join(f'{x:g}' for x in c['loads'])})")
    lines += ["", "Target: disaggregated goodput >= 1.3x co-located at load 0.8 on llama-3.1-8b@N150:", ""]
    for t in result["target"]:
        lines.append(f"- {t['setup']}: {ratio(t['goodput_vs_colocated'])} ({'met' if t['met'] else 'missed'})")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = clock_parser(__doc__ or "", "smoke run: 30 requests, load 0.8", DEFAULT_JSON, DEFAULT_MARKDOWN,
                          "run these loads only")
    args = parser.parse_args(argv)
    plan = narrowed(QUICK if args.quick else FULL, args)
    result = recorded({"schema_version": SCHEMA_VERSION, "quick": args.quick,
                       "trace": asdict(TraceSpec(num_requests=plan.num_requests)), "plan": asdict(plan)},
                      lambda: benchmark(plan))
    write_results(result, args.json, args.markdown, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
