"""Soak: saturating mixed traffic through one ``vllm serve`` on the host backend for a while.

Streaming and not, greedy and sampled, logprobs, stop strings, structured output, prompts of
1 to ~80 tokens and 1 to 500 new tokens; device sampling, async decode (overlapped readbacks
with modelled device time) and prefix caching on; the client cuts streams and drops requests
at random points. Pass (docs/reliability.md):

- 0 error answers for valid requests;
- every completed greedy request equal to the same request sent alone first;
- the RSS of every process of the server grows <= 5 % from just after warm-up to the end;
- ``/metrics`` drains to 0 running, 0 waiting, 0 % KV in use;
- every step prefill-only or decode-only, by the runner's phases (``TT_SAMPLING_TRACE``) and,
  independently, by the rows of the scheduler's step trace (``TT_STEP_TRACE``).

    python benchmarks/soak.py --minutes 30 [--mesh-device TG --lanes 4 --max-num-seqs 4]

Writes benchmarks/results/soak.json and soak.md (soak_tg.* with a mesh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "testing")]

from report import write_results  # noqa: E402
from vllm_tt_testing import traffic  # noqa: E402
from vllm_tt_testing.step_trace import check_step_trace  # noqa: E402
from vllm_tt_testing.traffic import Spec  # noqa: E402

from tests.e2e.helpers import living_group_members, serve_process  # noqa: E402

RESULTS = Path(__file__).parent / "results"
LENGTHS = (1, 4, 16, 64, 200, 500)
LENGTH_WEIGHTS = (2, 3, 4, 4, 2, 1)
RSS_EVERY_S = 10.0
WARMUP_FRACTION = 0.2
"""RSS is compared from the end of warm-up (this share of the run) to the end."""
LAG_TICK_S = 0.1
RSS_WINDOW = 6
"""Samples averaged at each end of the comparison (one minute)."""


@dataclass
class Mix:
    """Picks the next request of the soak."""

    texts: list[str]
    rng: random.Random

    def greedy_keys(self) -> list[Spec]:
        return [Spec(f"p{p}-n{n}", t, n, stream=False) for p, t in enumerate(self.texts) for n in LENGTHS]

    def next(self) -> Spec:
        r = self.rng
        p = r.randrange(len(self.texts))
        n = r.choices(LENGTHS, LENGTH_WEIGHTS)[0]
        stream, greedy = r.random() < 0.5, r.random() < 0.6
        extra: dict[str, object] = {}
        compare = greedy
        roll = r.random()
        if roll < 0.15:
            extra["logprobs"] = 2
        elif roll < 0.25:
            extra["stop"] = [" the", "."]
            compare = False
        elif roll < 0.30:
            extra["response_format"] = {"type": "json_object"}
            compare = False
        if not greedy and r.random() < 0.5:
            extra["seed"] = r.randrange(1 << 30)
        cancel = None
        if r.random() < 0.15:
            cancel = r.randint(1, max(1, n)) if stream else r.randint(20, 3000)
        return Spec(f"p{p}-n{n}", self.texts[p], n, stream, greedy, cancel, tuple(extra.items()), compare)


@dataclass
class RssTrack:
    samples: list[tuple[float, dict[int, int]]] = field(default_factory=list)

    def sample(self, t: float, pids: list[int]) -> None:
        rss = {}
        for pid in pids:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        rss[pid] = int(line.split()[1]) * 1024
            except OSError:
                continue
        self.samples.append((t, rss))

    def growth(self, warmup_s: float) -> dict[str, dict[str, float]]:
        """Per process: mean RSS over the first minute after warm-up and the last minute."""
        after = [s for s in self.samples if s[0] >= warmup_s]
        first, last = after[:RSS_WINDOW], after[-RSS_WINDOW:]
        out = {}
        for pid in sorted({p for _, rss in after for p in rss}):
            a = [rss[pid] for _, rss in first if pid in rss]
            b = [rss[pid] for _, rss in last if pid in rss]
            if a and b:
                start, end = statistics.mean(a), statistics.mean(b)
                out[str(pid)] = {"after_warmup_mib": start / 2**20, "end_mib": end / 2**20,
                                 "growth_pct": 100 * (end - start) / start}
        return out


async def soak(url: str, pgid: int, minutes: float, concurrency: int, seed: int) -> dict:
    rng = random.Random(seed)
    # Half the prompts share a ~200-token preamble, so prefix caching has whole blocks to hit.
    preamble = " ".join(traffic.prompts(40, seed + 1))[:1000]
    mix = Mix(traffic.prompts(4, seed) + [f"{preamble} {t}" for t in traffic.prompts(4, seed + 2)], rng)
    refs_start = time.monotonic()
    refs = await traffic.references(url, mix.greedy_keys())
    refs_s = time.monotonic() - refs_start
    tally = traffic.Tally()
    statuses: Counter[int] = Counter()
    rss = RssTrack()
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + minutes * 60

    async def worker(client: httpx.AsyncClient) -> None:
        while loop.time() < deadline:
            outcome = await traffic.send(client, url, mix.next())
            statuses[outcome.status] += 1
            tally.add(outcome, refs)

    async def sampler() -> None:
        while loop.time() < deadline:
            rss.sample(loop.time() - start, living_group_members(pgid))
            await asyncio.sleep(RSS_EVERY_S)

    lags: list[tuple[float, float]] = []

    async def lag_watch() -> None:
        """How late this client's event loop wakes up (a late client reads answers late)."""
        while loop.time() < deadline:
            before = loop.time()
            await asyncio.sleep(LAG_TICK_S)
            lags.append((before - start, loop.time() - before - LAG_TICK_S))

    async with traffic.connection_per_request(concurrency + 8, httpx.Timeout(600, connect=60)) as client:
        await asyncio.gather(sampler(), lag_watch(), *(worker(client) for _ in range(concurrency)))
    elapsed = loop.time() - start
    rss.sample(elapsed, living_group_members(pgid))
    drained = await traffic.drained(url)
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    hits, queries = (traffic.metric(metrics, f"vllm:prefix_cache_{n}_total") for n in ("hits", "queries"))
    return {"prefix_cache_hit_pct": 100 * hits / queries if queries else 0.0,"references": len(refs), "references_s": refs_s, "elapsed_s": elapsed, "finished": tally.finished,
            "cancelled": tally.cancelled, "problems": tally.problems, "by_kind": dict(tally.by_kind),
            "statuses": {str(k): v for k, v in statuses.items()}, "drained": asdict(drained),
            "rss": rss.growth(minutes * 60 * WARMUP_FRACTION), "client_lag_s": lag_figures(lags)}


def lag_figures(lags: list[tuple[float, float]]) -> dict:
    """How late the client's loop woke up: max, p99, how often and when (s into the run) > 1 s."""
    late = [lag for _, lag in lags]
    return {"max": max(late, default=0.0),
            "p99": statistics.quantiles(late, n=100, method="inclusive")[-1] if len(late) > 1 else 0.0,
            "over_1s": sum(lag > 1.0 for lag in late),
            "over_1s_at": [round(t) for t, lag in lags if lag > 1.0][:50]}


def phase_purity(trace: Path) -> dict:
    """Steps of the sampling trace by phase; any other phase value is a mixed or unknown step."""
    phases: Counter[str] = Counter()
    with trace.open() as lines:
        for line in lines:
            phases[json.loads(line).get("phase", "?")] += 1
    return {"steps": sum(phases.values()), "by_phase": dict(phases),
            "pure": set(phases) <= {"prefill", "decode"} and sum(phases.values()) > 0}


def markdown(r: dict) -> str:
    s = r["soak"]
    rss = "; ".join(f"{pid}: {v['after_warmup_mib']:.0f} -> {v['end_mib']:.0f} MiB ({v['growth_pct']:+.1f} %)"
                    for pid, v in s["rss"].items())
    checks = r["checks"]
    lines = [
        f"# Soak: {r['minutes']:g} min of mixed traffic ({r['date']})", "",
        f"`{r['command']}`", "",
        f"Server: `{' '.join(r['server_args'])}`{' with MESH_DEVICE=' + r['mesh_device'] if r['mesh_device'] else ''}",
        "", "| figure | value |", "|---|---|",
        f"| requests answered | {s['finished'] + s['cancelled'] + len(s['problems'])} "
        f"({s['finished']} finished, {s['cancelled']} cut by the client) |",
        f"| HTTP statuses (0 = cut by the client) | {s['statuses']} |",
        f"| error answers / wrong outputs | {len(s['problems'])} |",
        f"| greedy references (sent alone first) | {s['references']} in {s['references_s']:.0f} s |",
        f"| steps run (runner's TT_SAMPLING_TRACE, by phase) | {r['trace']['steps']} {r['trace']['by_phase']} |",
        f"| steps scheduled (TT_STEP_TRACE, by phase; mixed by their rows) | {r['step_trace']['steps']} "
        f"{r['step_trace']['by_phase']}; {r['step_trace']['mixed_steps']} mixed |",
        f"| client event loop late (max / p99) | {s['client_lag_s']['max']:.2f} / {s['client_lag_s']['p99']:.2f} s; "
        f"{s['client_lag_s']['over_1s']} wake-ups more than 1 s late |",
        f"| prefix cache hits (of prompt tokens queried) | {s.get('prefix_cache_hit_pct', float('nan')):.1f} % |",
        f"| RSS after warm-up -> end | {rss} |",
        f"| drained (running / waiting / KV) | {s['drained']['running']:g} / {s['drained']['waiting']:g} / "
        f"{s['drained']['kv_usage']:g} |", "",
        "| check | result |", "|---|---|",
    ] + [f"| {name} | {'pass' if ok else 'FAIL'} |" for name, ok in checks.items()]
    lines += ["", "Requests by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(s["by_kind"].items())), ""]
    lines += [f"- {p}" for p in s["problems"][:20]]
    lines += [f"- mixed step: {m}" for m in r["step_trace"]["mixed"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=40, help="clients in a closed loop (> --max-num-seqs)")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--mesh-device", default="", help="MESH_DEVICE, e.g. TG (with --lanes)")
    parser.add_argument("--lanes", type=int, default=0, help="serve in lanes: --data-parallel-size N on the mesh")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep-files", type=Path, help="keep the server's log and both step traces in this directory")
    args = parser.parse_args()
    from vllm_tt_host.tiny import build_tiny_checkpoint

    traffic.raise_fd_limit()
    server_args = ["--served-model-name", traffic.MODEL, "--max-num-seqs", str(args.max_num_seqs),
                   "--max-model-len", "1024", "--async-scheduling", "--enable-prefix-caching",
                   "--additional-config.tt.sample_on_device_mode", "all",
                   "--additional-config.tt.host_device_time", "1ms"]
    if args.lanes:  # one engine process of N lanes needs one API server (vLLM sizes it from -dp)
        server_args += ["--data-parallel-size", str(args.lanes), "--api-server-count", "1"]
    with tempfile.TemporaryDirectory(prefix="tt-soak-") as tmp:
        trace, step_trace = Path(tmp) / "steps.jsonl", Path(tmp) / "scheduled.jsonl"
        env = {"TT_SAMPLING_TRACE": str(trace), "TT_STEP_TRACE": str(step_trace)}
        if args.mesh_device:
            env["MESH_DEVICE"] = args.mesh_device
        model = Path(build_tiny_checkpoint("llama", Path(tmp) / "llama", train_steps=0, seed=0))
        with serve_process(model, *server_args, env=env, log=Path(tmp) / "serve.log") as server:
            result = asyncio.run(soak(server.url, server.process.pid, args.minutes, args.concurrency, args.seed))
        purity = phase_purity(trace)
        scheduled = check_step_trace(step_trace)
        log = (Path(tmp) / "serve.log").read_text()
        if args.keep_files:
            args.keep_files.mkdir(parents=True, exist_ok=True)
            for path in (trace, step_trace, Path(tmp) / "serve.log"):
                shutil.copy(path, args.keep_files)
    drained = result["drained"]
    growth = [v["growth_pct"] for v in result["rss"].values()]
    checks = {
        "0 error answers, every greedy output exact": not result["problems"],
        "RSS of every process grows <= 5 % after warm-up": bool(growth) and max(growth) <= 5.0,
        "drained to 0 running / 0 waiting / 0 KV": (drained["running"], drained["waiting"],
                                                    drained["kv_usage"]) == (0, 0, 0),
        "step trace phase-pure": purity["pure"] and "MixedStepError" not in log,
        "scheduled steps phase-pure by their rows (TT_STEP_TRACE)": scheduled.pure,
        "overlapped decode ran": "Overlapped decode on" in log,
    }
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python benchmarks/soak.py " + " ".join(sys.argv[1:]), "minutes": args.minutes,
           "mesh_device": args.mesh_device, "server_args": server_args, "concurrency": args.concurrency,
           "soak": result, "trace": purity,
           "step_trace": {"steps": scheduled.steps, "by_phase": dict(scheduled.by_phase),
                          "mixed_steps": scheduled.mixed_steps, "mixed": scheduled.mixed},
           "checks": checks, "passed": all(checks.values())}
    name = "soak" + (f"_{args.mesh_device.lower()}" if args.mesh_device else "")
    write_results(out, args.out / f"{name}.json", args.out / f"{name}.md", markdown(out))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
