"""The scheduler benchmark on a modelled device clock: what users feel, in milliseconds.

Each engine step takes the time the host backend's device-time model gives it
(``vllm_tt_platform.cost.device_time``): a step streams the weights and the KV it reads once (a
decode step's time) and its prefill rows add matmul time; it takes the longer of the two. vLLM's
stock scheduler's mixed steps are costed the same way, as if a mesh could run them. Reported per
run: mean and p99 time to first token, mean and p99 inter-token latency (over every interval),
and goodput, the share of requests meeting both SLOs (``SLO_TTFT_STEPS``, ``SLO_ITL_STEPS``).
"""

from __future__ import annotations

import statistics
from argparse import ArgumentParser, Namespace
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workload import Arrival, TraceDriver, TraceSpec

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SLO_TTFT_STEPS = 10.0
"""Goodput's TTFT bound, in decode-step times (``StepCost.slo_unit_s``)."""
SLO_ITL_STEPS = 1.25
"""Goodput's bound on a request's mean inter-token latency, in decode-step times."""
COST_MODELS = ("llama-3.1-8b@N150", "llama-3.3-70b@TG")
"""The meshes whose modelled device time turns steps into seconds."""


@dataclass(frozen=True)
class StepCost:
    """Modelled device time of one engine step, from the host backend's cost model."""

    spec: str
    costs: Any
    """A ``vllm_tt_platform.cost.device_time.ProgramCosts``."""

    @classmethod
    def of(cls, spec: str) -> StepCost:
        from vllm_tt_platform.cost.device_time import MODEL_PROFILES, parse_device_time
        from vllm_tt_platform.mesh.shape import MESH_PRESETS

        parsed = parse_device_time(spec)
        if parsed.mesh_preset is None or parsed.model not in MODEL_PROFILES:
            raise ValueError(f"{spec!r}: name a model profile and a mesh preset, e.g. {COST_MODELS[0]}")
        dims = MODEL_PROFILES[parsed.model]
        return cls(spec, parsed.resolve(dims, MESH_PRESETS[parsed.mesh_preset], parsed.mesh_preset))

    def scheduler_model(self) -> Any:
        """The same costs as the platform hands them to the scheduler (``tt._step_cost``)."""
        from vllm_tt_platform.config.step_cost import roofline

        return roofline(self.costs, f"{self.spec}: {self.costs.description}")

    def seconds(self, prefill_rows: list[tuple[int, int]], decode_rows: int, decode_context: int) -> float:
        """``prefill_rows``: (new tokens, cached tokens) per row; ``decode_rows`` read
        ``decode_context`` KV positions in all. A step holding both is one mixed program
        (``ProgramCosts.mixed_s``: one weight stream, every token's compute), for stock's mixed
        steps as for a model's captured ones."""
        if not prefill_rows:
            return float(self.costs.decode_s(decode_context))
        if decode_rows:
            return float(self.costs.mixed_s(decode_context, decode_rows, prefill_rows))
        stream = self.costs.decode_s(0)
        return float(max(stream, sum(self.costs.prefill_s(tokens, start) for tokens, start in prefill_rows)))

    def step_unit(self, trace: TraceSpec, rows: int) -> float:
        """Seconds per trace step: the stock scheduler's mean step at saturation (a decode
        step, plus its share of prefill time), so that a trace's load keeps its meaning."""
        prompt = (trace.prompt_min + trace.prompt_max) // 2
        output = (trace.output_min + trace.output_max) / 2
        return float(self.slo_unit_s(trace, rows) + rows / output * self.costs.prefill_s(prompt, 0))

    def slo_unit_s(self, trace: TraceSpec, rows: int) -> float:
        """One decode step of a full batch at the trace's mean context: the SLOs' unit."""
        prompt = (trace.prompt_min + trace.prompt_max) // 2
        output = (trace.output_min + trace.output_max) / 2
        return float(self.costs.decode_s(int(rows * (prompt + output / 2))))


@dataclass(frozen=True)
class TimedResult:
    cost_model: str
    engine: str
    load: float
    scheduler: str
    """``stock``, ``tt-steps`` (the step-counted policy), ``tt-cost`` (the cost-aware one) or
    ``tt-mixed`` (mixed steps of ``clock_bench.MIXED_CHUNKS``, the step-counted policy otherwise) or
    ``tt-mixed-slo`` (the same chunks sized to the ITL SLO, the cost-aware policy otherwise)."""
    prefill_hold: float | None
    slo_unit_ms: float
    ttft_mean_ms: float
    ttft_p99_ms: float
    itl_mean_ms: float
    itl_p99_ms: float
    goodput: float
    prefill_steps: int
    decode_steps: int
    mixed_steps: int
    preemptions: int
    host_us_per_step: float
    """``schedule()`` + ``update_from_output()`` per engine step, on this machine."""


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


class TimedDriver(TraceDriver):
    """A run on a modelled device clock: trace steps become seconds (``StepCost.step_unit``),
    and each engine step takes its modelled device time."""

    def __init__(self, sim: Any, label: dict[str, Any], trace: list[Arrival], spec: TraceSpec,
                 cost: StepCost, rows: int) -> None:
        super().__init__(sim, trace)
        self.label = label
        self.cost = cost
        self.unit = cost.step_unit(spec, rows)
        self.slo_unit = cost.slo_unit_s(spec, rows)
        self.clock = 0.0
        self.prompts = {arrival.req_id: arrival.prompt_len for arrival in trace}
        self.arrived = {arrival.req_id: arrival.step * self.unit for arrival in trace}
        self.computed: dict[str, int] = {}
        self.ends: dict[int, float] = {}

    def due(self, arrival: Arrival) -> bool:
        return arrival.step * self.unit <= self.clock

    def idle(self, upcoming: Arrival) -> None:
        self.clock = upcoming.step * self.unit

    def stepped(self, record: Any) -> None:
        for req_id in record.preempted:
            self.computed[req_id] = 0  # resumes by recomputing its tokens
        prefill, decodes, context = [], 0, 0
        for req_id, tokens in record.scheduled.items():
            start = self.computed.get(req_id, 0)
            if tokens > 1 or start < self.prompts[req_id]:
                prefill.append((tokens, start))
            else:
                decodes, context = decodes + 1, context + start
            self.computed[req_id] = start + tokens
        self.clock += self.cost.seconds(prefill, decodes, context)
        self.ends[record.index] = self.clock

    def token_times_s(self) -> dict[str, list[float]]:
        """When each request got each of its tokens, in seconds on this driver's clock."""
        return {req_id: [self.ends[step] for step in log.token_steps] for req_id, log in self.sim.logs.items()}

    def step_mix(self) -> dict[str, Any]:
        """Engine steps by phase: prefill, decode and mixed (stock's, or a model's captured ones)."""
        from vllm_tt_scheduler import Phase

        return {"prefill_steps": self.phases[Phase.PREFILL], "decode_steps": self.phases[Phase.DECODE],
                "mixed_steps": self.phases[None] + self.phases[Phase.MIXED]}

    def result(self) -> TimedResult:
        return TimedResult(
            **self.label, slo_unit_ms=self.slo_unit * 1e3,
            **latencies(self.arrived, self.token_times_s(), self.slo_unit), **self.step_mix(),
            preemptions=self.preemptions,
            host_us_per_step=(self.sim.host.schedule + self.sim.host.update) * 1e6 / max(self.sim.host.steps, 1),
        )


def latencies(arrived: dict[str, float], token_times: dict[str, list[float]], slo_unit: float) -> dict[str, Any]:
    """Mean and p99 TTFT and ITL in ms, and goodput (both SLOs met, in ``slo_unit`` seconds), of
    requests that arrived at ``arrived`` seconds and got their tokens at ``token_times``."""
    ttfts, gaps, good = [], [], 0
    for req_id, times in token_times.items():
        ttft = times[0] - arrived[req_id]
        own = [b - a for a, b in zip(times, times[1:], strict=False)]
        ttfts.append(ttft)
        gaps += own
        mean_itl = statistics.fmean(own) if own else 0.0
        good += ttft <= SLO_TTFT_STEPS * slo_unit and mean_itl <= SLO_ITL_STEPS * slo_unit
    ms = 1e3
    return {"ttft_mean_ms": statistics.fmean(ttfts) * ms, "ttft_p99_ms": p99(ttfts) * ms,
            "itl_mean_ms": statistics.fmean(gaps) * ms, "itl_p99_ms": p99(gaps) * ms, "goodput": good / len(ttfts)}


def versus_stock(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each TT row with its ratios to the stock row of the same cost model, engine and load."""
    stock = {(r["cost_model"], r["engine"], r["load"]): r for r in rows if r["scheduler"] == "stock"}
    for row in rows:
        base = stock[(row["cost_model"], row["engine"], row["load"])]
        for field in ("ttft_mean_ms", "itl_mean_ms", "goodput", "host_us_per_step"):
            row[f"{field}_vs_stock"] = None if row is base or not base[field] else row[field] / base[field]
    return rows


def timed_markdown(timed: dict[str, Any]) -> list[str]:
    """One table per cost model: every run, TT relative to stock at the same KV pool and load."""
    slo = timed["slo"]
    lines: list[str] = []
    for model in timed["cost_models"]:
        rows = [row for row in timed["rows"] if row["cost_model"] == model]
        lines += [
            *clock_heading(model, rows[0]["slo_unit_ms"], slo),
            "| KV pool | load | scheduler | prefill_hold | TTFT mean / p99 (ms) | ITL mean / p99 (ms) | goodput "
            "| TTFT vs stock | ITL vs stock | goodput vs stock | prefill / decode / mixed steps | preemptions "
            "| host cost per step vs stock |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in rows:
            def ratio(key: str, row: dict[str, Any] = row) -> str:
                return "-" if row[key] is None else f"{row[key]:.2f}x"

            hold = "-" if row["prefill_hold"] is None else f"{row['prefill_hold']:g}"
            lines.append(
                f"| {row['engine']} | {row['load']} | {row['scheduler']} | {hold} "
                f"| {row['ttft_mean_ms']:.0f} / {row['ttft_p99_ms']:.0f} | {row['itl_mean_ms']:.1f} / "
                f"{row['itl_p99_ms']:.0f} | {row['goodput']:.2f} | {ratio('ttft_mean_ms_vs_stock')} "
                f"| {ratio('itl_mean_ms_vs_stock')} | {ratio('goodput_vs_stock')} "
                f"| {row['prefill_steps']} / {row['decode_steps']} / {row['mixed_steps']} | {row['preemptions']} "
                f"| {ratio('host_us_per_step_vs_stock')} |"
            )
        lines.append("")
    return lines


def clock_heading(model: str, slo_unit_ms: float, slo: dict[str, float]) -> list[str]:
    """The line above a cost model's table: its SLO unit and what goodput counts."""
    return [f"On the modelled device clock of {model} (SLO unit: one full-batch decode step, {slo_unit_ms:.1f} ms; "
            f"goodput: TTFT <= {slo['ttft_decode_steps']:g} and mean ITL <= {slo['itl_decode_steps']:g} of those):", ""]


def clock_parser(doc: str, quick_help: str, json_path: Path, markdown_path: Path, loads_help: str) -> ArgumentParser:
    """A clock bench's command line: ``--quick``, where to write, and what to narrow the plan to."""
    parser = ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", type=Path, default=json_path)
    parser.add_argument("--markdown", type=Path, default=markdown_path)
    parser.add_argument("--requests", type=int, default=None, help="override the trace length")
    parser.add_argument("--cost-model", choices=COST_MODELS, default=None, help="run one cost model only")
    parser.add_argument("--loads", type=float, nargs="+", default=None, help=loads_help)
    return parser


def narrowed[PlanT: DataclassInstance](plan: PlanT, args: Namespace) -> PlanT:
    """``plan`` (a dataclass with ``num_requests``, ``cost_models`` and ``loads``) as the command
    line of ``clock_parser`` narrows it."""
    if args.requests is not None:
        plan = replace(plan, num_requests=args.requests)
    if args.cost_model is not None:
        plan = replace(plan, cost_models=(args.cost_model,))
    if args.loads is not None:
        plan = replace(plan, loads=tuple(args.loads))
    return plan
