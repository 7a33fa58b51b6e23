#!/usr/bin/env python
"""In-process lanes: what the lane coordinator costs on the host, and what it buys end to end.

(a) Host cost per engine step (schedule() + update_from_output()) of TTLaneCoordinator with
    4 lanes x 8 rows against one TTScheduler with 32 rows, on the same synthetic request trace,
    as a ratio (target <= 1.3x). No model runs: the simulator's fake runner samples tokens
    (``vllm_tt_testing.scheduler_sim``). The two run in alternating chunks of steps, so machine noise
    (other processes) hits both alike; each pair is repeated and the median ratio reported.
(b) End-to-end tokens/s through ``vllm serve`` on the host backend emulating a Galaxy (TG) with
    modelled device time: lanes (one engine process, one program per step over the mesh) against
    vLLM's standard multi-process data parallelism over the same mesh. Needs the host backend's
    ``host_device_time`` option; reported as pending where the installed platform lacks it.

Writes JSON and a markdown table into benchmarks/results/.

    python benchmarks/lanes_bench.py            # full run
    python benchmarks/lanes_bench.py --quick    # smoke run (about a minute)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))  # also when loaded by file path (tests)
sys.path.insert(0, str(REPO / "testing"))  # vllm_tt_testing: the in-repo test support
from report import write_results  # noqa: E402
from workload import Arrival, TraceDriver, TraceSpec, make_trace, run_alternating  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
SCHEMA_VERSION = 1
HOST_COST_TARGET = 1.3


TRACE = TraceSpec(num_requests=1500)
"""Poisson arrivals at 0.9 of the decode capacity of 32 rows."""


@dataclass(frozen=True)
class Shape:
    """One side of the comparison: ``lanes`` x ``rows`` (1 lane = the single scheduler)."""

    name: str
    lanes: int
    rows: int
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048
    block_size: int = 64

    def per_seq_blocks(self) -> int:
        return math.ceil(self.max_model_len / self.block_size)

    def pool_blocks(self) -> int:
        """KV blocks per pool (per lane): room for every row at full length, plus the null block."""
        return self.rows * self.per_seq_blocks() + 1


SINGLE = Shape("1 x 32 (TTScheduler)", lanes=1, rows=32)
LANES = Shape("4 x 8 (TTLaneCoordinator)", lanes=4, rows=8)


@dataclass(frozen=True)
class HostRun:
    shape: str
    steps: int
    host_us_per_step: float
    host_us_per_token: float
    schedule_us_per_step: float
    update_us_per_step: float
    prefill_steps: int
    decode_steps: int
    mean_ttft_steps: float
    mean_itl_steps: float
    preemptions: int


class Driver(TraceDriver):
    """Feeds one scheduler the trace, a chunk of engine steps at a time."""

    def __init__(self, shape: Shape, trace: list[Arrival]) -> None:
        from vllm_tt_scheduler import TTLaneCoordinator, TTScheduler
        from vllm_tt_scheduler.lanes.shape import LaneShape
        from vllm_tt_testing.scheduler_sim import Engine, SimConfig, build_scheduler

        tt: dict[str, object] = {}
        cls: Any = TTScheduler
        if shape.lanes > 1:
            LaneShape(shape.lanes, shape.rows).record(tt)
            cls = TTLaneCoordinator
        config = SimConfig(
            max_num_seqs=shape.lanes * shape.rows, max_num_batched_tokens=shape.max_num_batched_tokens,
            max_model_len=shape.max_model_len, block_size=shape.block_size, num_blocks=shape.pool_blocks(), tt=tt,
        )
        self.shape = shape
        super().__init__(Engine(build_scheduler(cls, config)), trace)

    def result(self) -> HostRun:
        from vllm_tt_scheduler import Phase

        times = self.token_times()
        host = self.sim.host
        total_us = (host.schedule + host.update) * 1e6
        return HostRun(
            shape=self.shape.name, steps=host.steps, host_us_per_step=total_us / host.steps,
            host_us_per_token=total_us / times.tokens,
            schedule_us_per_step=host.schedule * 1e6 / host.steps, update_us_per_step=host.update * 1e6 / host.steps,
            prefill_steps=self.phases[Phase.PREFILL], decode_steps=self.phases[Phase.DECODE],
            mean_ttft_steps=times.ttft_steps, mean_itl_steps=times.itl_steps, preemptions=self.preemptions,
        )


def host_cost(spec: TraceSpec, pairs: int) -> dict[str, Any]:
    trace = make_trace(spec, SINGLE.lanes * SINGLE.rows)
    ratios, token_ratios, runs = [], [], []
    for pair in range(pairs):
        shapes = [SINGLE, LANES] if pair % 2 == 0 else [LANES, SINGLE]  # alternate who goes first
        by_shape = {r.shape: r for r in run_alternating([Driver(shape, trace) for shape in shapes])}
        single, lanes = by_shape[SINGLE.name], by_shape[LANES.name]
        runs += [asdict(single), asdict(lanes)]
        ratios.append(lanes.host_us_per_step / single.host_us_per_step)
        token_ratios.append(lanes.host_us_per_token / single.host_us_per_token)
    median = statistics.median(ratios)
    return {
        "trace": asdict(spec),
        "shapes": {s.name: {**asdict(s), "pool_blocks": s.pool_blocks()} for s in (SINGLE, LANES)},
        "ratio_per_step_median": median,
        "ratios_per_step": ratios,
        "ratio_per_token_median": statistics.median(token_ratios),
        "target": HOST_COST_TARGET,
        "meets_target": median <= HOST_COST_TARGET,
        "runs": runs,
    }


def coordinator_share(spec: TraceSpec) -> dict[str, float]:
    """Where a lane-mode step's host time goes: inside the lanes' own schedulers (views, vLLM
    passes, updates) or in the coordinator (combining views, merging outputs, routing results).
    A separate, instrumented run: the timers add a little to both sides."""
    driver = Driver(LANES, make_trace(spec, SINGLE.lanes * SINGLE.rows))
    inside = [0.0]

    def timed(method: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - start

        return call

    for lane in driver.sim.scheduler.lanes:
        for name in ("work_view", "idle_in", "run_pass", "fallback_phase", "end_step", "update_from_output"):
            setattr(lane, name, timed(getattr(lane, name)))
    run = run_alternating([driver])[0]
    total_us = run.host_us_per_step
    inside_us = inside[0] * 1e6 / run.steps
    return {"host_us_per_step": total_us, "inside_lanes_us_per_step": inside_us,
            "coordinator_us_per_step": total_us - inside_us, "coordinator_fraction": 1 - inside_us / total_us}


# -- (b) end to end --------------------------------------------------------------------------
E2E_DEVICE_TIME = "14ms"
"""Every emulated program (a decode step, a prefill row) takes this long on one sub-mesh, for
both sides: about a Llama-3.3-70B decode step on a Galaxy (the host backend's cost model,
``llama-3.3-70b@TG``). The same time per program per sub-mesh on both sides: a lane-mode program
runs the four sub-meshes side by side (a prefill call takes its busiest lane's rows), as the four
data-parallel ranks each run their own."""


@dataclass(frozen=True)
class E2ESpec:
    concurrent: int = 64
    prompt_tokens: int = 64
    output_tokens: int = 128


def device_time_available() -> bool:
    from dataclasses import fields

    from vllm_tt_platform.config.options import TTConfig

    return any(f.name == "host_device_time" for f in fields(TTConfig))


def dense_bundle(root: Path) -> Path:
    """A bundle serving the host Llama without ``single_program_lanes``: vLLM's multi-process DP."""
    folder = root / "bundles" / "host_llama_dp"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vllm_metadata.json").write_text(json.dumps({
        "arch": "LlamaForCausalLM",
        "main_class": "vllm_tt_host.models.families:HostLlamaForCausalLM",
        "description": "host Llama, standard multi-process data parallelism (lanes_bench.py)",
        "capabilities": {"single_program_lanes": False},
    }))
    return folder.parent


def _serve_and_measure(model: Path, env: dict[str, str], log: Path, spec: E2ESpec, trace: Path) -> dict[str, Any]:
    """Serve, warm up, then time ``spec.concurrent`` requests; ``trace`` gets the step trace
    (with multi-process DP, every rank appends its own lines)."""
    import concurrent.futures

    sys.path.insert(0, str(REPO))
    import openai

    from tests.e2e.helpers import serve

    tt = json.dumps({"tt": {"host_device_time": E2E_DEVICE_TIME, "host_skip_math": True,
                            "sample_on_device_mode": "all"}})
    # As deployed: async scheduling overlaps each step's host work with the device's.
    args = ("--served-model-name", "tiny", "--data-parallel-size", "4", "--max-num-seqs", "8",
            "--api-server-count", "1", "--max-model-len", "512", "--async-scheduling", "--additional-config", tt)
    env = {**env, "TT_STEP_TRACE": str(trace)}
    with serve(model, *args, env=env, log=log, timeout=1200) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600)

        def ask(i: int, max_tokens: int = spec.output_tokens) -> int:
            prompt = [3 + (i * 7 + j) % 900 for j in range(spec.prompt_tokens)]
            result = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                               temperature=0, extra_body={"ignore_eos": True})
            if result.usage is None:
                raise RuntimeError("the server reported no token usage")
            return result.usage.completion_tokens

        with concurrent.futures.ThreadPoolExecutor(max_workers=spec.concurrent) as pool:
            list(pool.map(lambda i: ask(i, 4), range(spec.concurrent)))  # warm-up: every rank/lane
            first_step = len(trace.read_text().splitlines())
            start = time.perf_counter()
            tokens = sum(pool.map(ask, range(spec.concurrent)))
            seconds = time.perf_counter() - start
    result: dict[str, Any] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
    result["device"] = device_time_from_trace(trace, first_step)
    return result


def device_time_from_trace(trace: Path, first_step: int) -> dict[str, float]:
    """Modelled device time of the steps in ``trace`` from line ``first_step`` on: a decode step
    is one program, a prefill step takes its rows one after another (lane mode: the busiest
    lane's rows, the sub-meshes side by side). With multi-process DP the lines of all ranks are
    summed, so ``device_s`` is the ranks' total; divide by the ranks for one rank's share."""
    from vllm_tt_platform.cost.device_time import parse_device_time

    program_s = parse_device_time(E2E_DEVICE_TIME).fixed_s or 0.0
    steps = {"prefill": 0, "decode": 0, "empty": 0}
    prefill_programs = 0
    for line in trace.read_text().splitlines()[first_step:]:
        step = json.loads(line)
        steps[step["phase"]] += 1
        if step["phase"] == "prefill":
            lanes = step.get("lanes") or [step]
            prefill_programs += max(len(lane["scheduled"]) for lane in lanes)
    return {"prefill_steps": steps["prefill"], "decode_steps": steps["decode"], "empty_steps": steps["empty"],
            "prefill_s": prefill_programs * program_s, "decode_s": steps["decode"] * program_s,
            "device_s": (prefill_programs + steps["decode"]) * program_s}


def end_to_end(quick: bool, root: Path) -> dict[str, Any]:
    if quick:
        return {"status": "skipped", "reason": "not run with --quick or --skip-e2e (two `vllm serve` start-ups)"}
    if not device_time_available():
        return {"status": "pending", "reason": "the host backend has no host_device_time option yet "
                                               "(modelled device time, tt-platform config.py)"}
    from vllm_tt_host.tiny import build_tiny_checkpoint

    spec = E2ESpec()
    model = build_tiny_checkpoint("llama", root / "llama")
    base = {"TT_MESH_BACKEND": "host", "HF_HUB_OFFLINE": "1"}
    lanes = _serve_and_measure(model, {**base, "MESH_DEVICE": "TG"}, root / "lanes.log", spec,
                               trace=root / "lanes-steps.jsonl")
    # Each rank opens its own (2,4) sub-mesh of the Galaxy.
    dp = _serve_and_measure(model, {**base, "MESH_DEVICE": "(2,4)", "EXTRA_MODELS_DIR": str(dense_bundle(root))},
                            root / "dp.log", spec, trace=root / "dp-steps.jsonl")
    return {"status": "done", "device_time": E2E_DEVICE_TIME, "spec": asdict(spec),
            "runs": {"lanes": lanes, "multiprocess_dp": dp},
            "lanes_over_dp": lanes["tokens_per_s"] / dp["tokens_per_s"],
            "decode_steps_floor": decode_steps_floor(spec, rows=32)}


def decode_steps_floor(spec: E2ESpec, rows: int) -> int:
    """Decode steps the requests need at least: waves of ``rows`` requests, one token each per
    step (a request's first token comes from its prefill)."""
    return math.ceil(spec.concurrent / rows) * (spec.output_tokens - 1)


def e2e_markdown(e2e: dict[str, Any], cpus: int | None) -> list[str]:
    spec, lanes, dp = e2e["spec"], e2e["runs"]["lanes"], e2e["runs"]["multiprocess_dp"]
    ld, dd = lanes["device"], dp["device"]
    rank_device_s = dd["device_s"] / 4
    program_s = ld["decode_s"] / max(ld["decode_steps"], 1)
    floor_s = e2e["decode_steps_floor"] * program_s
    return [
        f"{spec['concurrent']} concurrent requests ({spec['prompt_tokens']}-token prompts, {spec['output_tokens']} "
        f"tokens each, greedy) through `vllm serve` and the OpenAI client; host backend, model math "
        f"skipped, sampling on device, async scheduling; every device program (a decode step, a prefill "
        f"row) takes {e2e['device_time']} on one `(2,4)` sub-mesh, on both sides (lanes: a prefill call takes "
        "its busiest lane's rows, the sub-meshes side by side). Both sides: 4 x 8 rows on an emulated TG.",
        "",
        "| data parallelism | engine processes | tokens | seconds | tokens/s | decode / prefill steps "
        "| modelled device s (per rank) |",
        "|---|---:|---:|---:|---:|---:|---:|",
        f"| in-process lanes (`MESH_DEVICE=TG`, one program per step) | 1 | {lanes['tokens']} "
        f"| {lanes['seconds']:.2f} | {lanes['tokens_per_s']:.0f} | {ld['decode_steps']} / {ld['prefill_steps']} "
        f"| {ld['device_s']:.2f} |",
        f"| vLLM multi-process DP (`MESH_DEVICE=(2,4)` per rank) | 4 | {dp['tokens']} "
        f"| {dp['seconds']:.2f} | {dp['tokens_per_s']:.0f} | {dd['decode_steps'] / 4:.0f} / "
        f"{dd['prefill_steps'] / 4:.1f} per rank | {rank_device_s:.2f} |",
        "",
        f"**Lanes / multi-process DP: {e2e['lanes_over_dp']:.2f}x tokens/s** (on {cpus} host cores shared by "
        "every process of both setups).",
        "",
        f"Where the time goes (step traces of the measured window): the lanes' device was busy "
        f"{ld['device_s']:.2f} s of {lanes['seconds']:.2f} s ({ld['device_s'] / lanes['seconds']:.0%}; decode "
        f"{ld['decode_s']:.2f} s, prefill {ld['prefill_s']:.2f} s); each DP rank's "
        f"{rank_device_s:.2f} s of {dp['seconds']:.2f} s ({rank_device_s / dp['seconds']:.0%}). Both sides are "
        f"bound by the modelled device: {spec['concurrent']} requests on 32 rows need at least "
        f"{e2e['decode_steps_floor']} decode steps ({floor_s:.2f} s), and each side ran that many plus its "
        "prefill steps, with host work overlapped (async scheduling). With the same device time per "
        "program per sub-mesh on both sides, lanes could only be 1.5x faster if the DP ranks' devices sat "
        "idle a third of the time, waiting for their hosts; here they are busy almost all the time.",
    ]


# -- report ----------------------------------------------------------------------------------
def markdown(result: dict[str, Any]) -> str:
    cost = result["host_cost"]
    spec = cost["trace"]
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for run in cost["runs"]:
        by_shape.setdefault(run["shape"], []).append(run)
    lines = [
        "# Lanes benchmark",
        "",
        f"Command: `python benchmarks/lanes_bench.py{' --quick' if result['quick'] else ''}`  ",
        f"vLLM {result['vllm']}, Python {result['machine']['python']}, {result['seconds']:.0f} s on "
        f"{result['machine']['cpus']} cores, 1-minute load average {result['machine']['loadavg_1min'][0]:.1f} at "
        f"the start and {result['machine']['loadavg_1min'][1]:.1f} at the end. Host timings are wall-clock on a "
        "shared machine; read the ratios, not the microseconds.",
        "",
        "## (a) Coordinator host cost per step",
        "",
        f"Trace: {spec['num_requests']} requests, prompts {spec['prompt_min']}-{spec['prompt_max']}, outputs "
        f"{spec['output_min']}-{spec['output_max']} tokens, Poisson arrivals at {spec['load']} of the decode "
        "capacity of 32 rows; 2048-token step budget (per lane), KV for every row at full length.",
        "",
        f"**Lanes / single, host cost per step (median of {len(cost['ratios_per_step'])}): "
        f"{cost['ratio_per_step_median']:.2f}x** (target <= {cost['target']}x; each pair: "
        + ", ".join(f"{r:.2f}" for r in cost["ratios_per_step"])
        + f"); per generated token: {cost['ratio_per_token_median']:.2f}x.",
        "",
        "| scheduler | steps | host us/step | schedule us/step | update us/step | host us/token "
        "| prefill / decode steps | mean TTFT (steps) | mean ITL (steps) | preemptions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, runs in by_shape.items():
        def mean(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.fmean(r[key] for r in runs)

        first = runs[0]
        lines.append(
            f"| {name} | {first['steps']} | {mean('host_us_per_step'):.0f} | {mean('schedule_us_per_step'):.0f} "
            f"| {mean('update_us_per_step'):.0f} | {mean('host_us_per_token'):.1f} "
            f"| {first['prefill_steps']} / {first['decode_steps']} | {first['mean_ttft_steps']:.1f} "
            f"| {first['mean_itl_steps']:.3f} | {first['preemptions']} |"
        )
    share = cost["breakdown"]
    lines += [
        "",
        f"Where a lane-mode step's {share['host_us_per_step']:.0f} us go (instrumented run): "
        f"{share['inside_lanes_us_per_step']:.0f} us inside the four lanes' schedulers (views, vLLM passes, "
        f"updates), {share['coordinator_us_per_step']:.0f} us ({share['coordinator_fraction']:.0%}) in the "
        "coordinator itself (combining views, merging outputs with block renumbering, routing results). "
        "The rest of the gap to one 32-row scheduler is vLLM's fixed cost per scheduling pass and update, "
        "paid once per lane.",
    ]
    e2e = result["end_to_end"]
    lines += ["", "## (b) End-to-end tokens/s: lanes vs multi-process data parallelism", ""]
    if e2e["status"] != "done":
        lines.append(f"{e2e['status'].capitalize()}: {e2e['reason']}.")
    else:
        lines += e2e_markdown(e2e, result["machine"]["cpus"])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: a short trace, one pair, no serving")
    parser.add_argument("--json", type=Path, default=RESULTS / "lanes_bench.json")
    parser.add_argument("--markdown", type=Path, default=RESULTS / "lanes_bench.md")
    parser.add_argument("--requests", type=int, default=None, help="override the trace length")
    parser.add_argument("--skip-e2e", action="store_true", help="only (a), the host cost")
    args = parser.parse_args(argv)

    spec = replace(TRACE, num_requests=120) if args.quick else TRACE
    if args.requests is not None:
        spec = replace(spec, num_requests=args.requests)
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    result: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "quick": args.quick}
    result["host_cost"] = host_cost(spec, pairs=1 if args.quick else 3)
    result["host_cost"]["breakdown"] = coordinator_share(spec)
    with tempfile.TemporaryDirectory(prefix="lanes-bench-") as root:
        result["end_to_end"] = end_to_end(args.quick or args.skip_e2e, Path(root))
    import vllm

    result["vllm"] = vllm.__version__
    result["machine"] = {"python": sys.version.split()[0], "platform": platform.platform(),
                         "cpus": os.cpu_count(), "loadavg_1min": [load_start, os.getloadavg()[0]]}
    result["seconds"] = time.perf_counter() - started
    write_results(result, args.json, args.markdown, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
