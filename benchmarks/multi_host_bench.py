#!/usr/bin/env python
"""Past one host: tokens/s of two hosts against one, on the same per-host mesh.

Two process trees on loopback stand for two hosts (a head with the OpenAI server, a
``--headless`` host), as in ``tests/e2e/test_multi_host.py``; the one-host baseline is a plain
``vllm serve`` of the same per-host configuration. Both sides run the host backend with modelled
device time (every program takes ``DEVICE_TIME``, the math skipped) and the same concurrent
requests. Reported per case:

- **device tokens/s**: completion tokens over the busiest engine's modelled device time (the
  ``vllm_tt:device_time_per_step_seconds`` sums per engine on the head's ``/metrics``, warm-up
  subtracted): what the hosts deliver when each host's device is the bottleneck. The TT series
  reach the head over a channel local to each host, so with two hosts only the head's engine
  reports ("engines reporting" in the table); the figure is then the head's engine alone;
- **wall tokens/s**: completion tokens over the wall time of the run. On this machine every
  "host" shares the same CPU cores, so the wall figure also counts the two hosts' host work
  competing for them; on two real hosts it would not.

Cases: ``dense`` (a model without ``single_program_lanes``: one DP rank per host on a (1,1)
mesh) and ``lanes`` (``MESH_DEVICE=TG``, 4 in-process lanes per host; two hosts are
``--data-parallel-size 8 --data-parallel-size-local 4``). Target: two hosts >= 1.8x one host.
Each case offers 8 full decode batches per host on one host, 4 per engine on two, so every
engine keeps requests waiting: when the requests only just fill each engine's rows, the ones
reaching a rank late (client threads and the API server on shared cores spread them over up to
a second or two) leave its decode batch part-empty, and with a fixed cost per program the run
measures that admission spread, not the devices. The "decode fill" column (rows holding a
request over rows offered, summed over the busiest engine's decode steps) shows it.

    python benchmarks/multi_host_bench.py                # both cases
    python benchmarks/multi_host_bench.py --case dense   # one (the other case's last results are kept)
    python benchmarks/multi_host_bench.py --quick        # the dense case, 32 requests
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))
from lanes_bench import dense_bundle  # noqa: E402
from report import write_results  # noqa: E402

from tests.e2e.helpers import serve, two_hosts  # noqa: E402

DEVICE_TIME = "14ms"
"""One program (a decode step, a prefill row) on one host's mesh: about a Llama-3.3-70B decode
step on a Galaxy (the host backend's ``llama-3.3-70b@TG``), as in lanes_bench.py."""
RESULTS = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Case:
    name: str
    mesh: str
    ranks_per_host: int
    rows: int
    """Decode rows per rank (``--max-num-seqs``; per lane in lane mode)."""
    concurrent: int
    prompt_tokens: int = 64
    output_tokens: int = 64
    dense: bool = False
    """Serve through a bundle without ``single_program_lanes`` (vLLM's own DP ranks)."""


CASES = {
    "dense": Case("dense", "N150", ranks_per_host=1, rows=16, concurrent=128, dense=True),
    "lanes": Case("lanes", "TG", ranks_per_host=4, rows=8, concurrent=256),
}


SERIES = {"vllm_tt:device_time_per_step_seconds_sum": "device_s", "vllm_tt:decode_rows_used_total": "rows_used",
          "vllm_tt:decode_rows_total": "rows", "vllm_tt:steps_total": "steps"}
"""The TT series the benchmark reads, per engine (summed over their other labels)."""


def _engine_totals(url: str) -> dict[str, dict[str, float]]:
    """Per engine index, from the head's /metrics: modelled device seconds, decode rows used and
    offered (their ratio is the decode batch's fill), and steps."""
    per_engine: dict[str, dict[str, float]] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0]
        engine = re.search(r'engine="(\d+)"', line)
        if name in SERIES and engine:
            totals = per_engine.setdefault(engine.group(1), dict.fromkeys(SERIES.values(), 0.0))
            totals[SERIES[name]] += float(line.rsplit(" ", 1)[1])
    return per_engine


def _measure(url: str, case: Case) -> dict[str, Any]:
    import openai

    # Retries: a pooled keep-alive connection the server closes just as it is reused (uvicorn drops
    # idle ones after 5 s) fails with "Server disconnected" before the server saw the request.
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=1200, max_retries=3)

    def ask(i: int, max_tokens: int) -> int:
        prompt = [3 + (i * 7 + j) % 900 for j in range(case.prompt_tokens)]
        result = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                           temperature=0, extra_body={"ignore_eos": True})
        if result.usage is None:
            raise RuntimeError("the server reported no token usage")
        return result.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(max_workers=case.concurrent) as pool:
        list(pool.map(lambda i: ask(i, 4), range(case.concurrent)))  # warm-up: every engine and lane
        before = _engine_totals(url)
        start = time.perf_counter()
        tokens = sum(pool.map(lambda i: ask(i, case.output_tokens), range(case.concurrent)))
        seconds = time.perf_counter() - start
    after = _engine_totals(url)
    run = {e: {k: v - before.get(e, {}).get(k, 0.0) for k, v in totals.items()} for e, totals in after.items()}
    device = {e: totals["device_s"] for e, totals in run.items()}
    busiest = max(device.values())
    return {"tokens": tokens, "wall_s": seconds, "wall_tokens_per_s": tokens / seconds,
            "device_s_per_engine": device, "device_tokens_per_s": tokens / busiest,
            "engines_reporting": len(device),
            "steps_per_engine": {e: totals["steps"] for e, totals in run.items()},
            "decode_fill_per_engine": {e: totals["rows_used"] / totals["rows"] if totals["rows"] else 0.0
                                       for e, totals in run.items()}}


def run_case(case: Case, root: Path) -> dict[str, Any]:
    from vllm_tt_host.tiny import build_tiny_checkpoint

    (root / f"{case.name}-two").mkdir(parents=True)
    model = build_tiny_checkpoint("llama", root / "llama")
    env = {"MESH_DEVICE": case.mesh, "HF_HUB_OFFLINE": "1"}
    if case.dense:
        env["EXTRA_MODELS_DIR"] = str(dense_bundle(root))
    tt = json.dumps({"tt": {"host_device_time": DEVICE_TIME, "host_skip_math": True,
                            "sample_on_device_mode": "all"}})
    args = ("--max-num-seqs", str(case.rows), "--max-model-len", "512", "--async-scheduling",
            "--additional-config", tt)
    local = str(case.ranks_per_host)
    with serve(model, "--served-model-name", "tiny", "--api-server-count", "1", "--data-parallel-size", local,
               *args, env=env, log=root / f"{case.name}-one.log", timeout=1200) as url:
        one = _measure(url, case)
    with two_hosts(model, root / f"{case.name}-two", 2 * case.ranks_per_host, case.ranks_per_host, *args,
                   env=env, timeout=1200) as hosts:
        two = _measure(hosts.url, case)
    return {"case": asdict(case), "one_host": one, "two_hosts": two,
            "device_speedup": two["device_tokens_per_s"] / one["device_tokens_per_s"],
            "wall_speedup": two["wall_tokens_per_s"] / one["wall_tokens_per_s"]}


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Two hosts against one (modelled device time)", "",
        f"Every program takes {result['device_time']} on a host's mesh; math skipped; "
        f"{result['cpus']} CPU cores shared by every process of both \"hosts\". Command: "
        "`python benchmarks/multi_host_bench.py`.", "",
        "| case | mesh per host | ranks/lanes per host x rows | requests | hosts | engines reporting | tokens | device s (busiest engine) "
        "| steps (same engine) | decode fill | device tokens/s | wall s | wall tokens/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        case = run["case"]
        for hosts, key in ((1, "one_host"), (2, "two_hosts")):
            r = run[key]
            busiest = max(r["device_s_per_engine"], key=r["device_s_per_engine"].get)
            steps = r.get("steps_per_engine", {}).get(busiest)
            fill = r.get("decode_fill_per_engine", {}).get(busiest)
            steps_text = "-" if steps is None else f"{steps:.0f}"
            fill_text = "-" if fill is None else f"{fill:.0%}"
            lines.append(
                f"| {case['name']} | {case['mesh']} | {case['ranks_per_host']} x {case['rows']} | {case['concurrent']} "
                f"| {hosts} | {r.get('engines_reporting', len(r['device_s_per_engine']))} of {hosts} | {r['tokens']} | {max(r['device_s_per_engine'].values()):.2f} "
                f"| {steps_text} | {fill_text} "
                f"| {r['device_tokens_per_s']:.0f} | {r['wall_s']:.1f} | {r['wall_tokens_per_s']:.0f} |")
    lines += ["", "| case | two hosts / one host, device tokens/s (target >= 1.8x) | same, wall tokens/s |",
              "|---|---|---|"]
    lines += [f"| {r['case']['name']} | **{r['device_speedup']:.2f}x** | {r['wall_speedup']:.2f}x |"
              for r in result["runs"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None, *, run: Callable[[Case, Path], dict[str, Any]] = run_case) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--quick", action="store_true", help="the dense case only, 32 requests")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work-dir", type=Path, help="keep checkpoints and server logs here (default: a temporary "
                        "folder, removed afterwards)")
    options = parser.parse_args(argv)
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1")  # vLLM's DP queues on loopback
    names = list(CASES) if options.case == "all" else [options.case]
    cases = [replace(CASES["dense"], concurrent=32)] if options.quick else [CASES[name] for name in names]
    with tempfile.TemporaryDirectory() as tmp:
        work = options.work_dir or Path(tmp)
        runs = [run(case, work / case.name) for case in cases]
    json_path = options.out / "multi_host_bench.json"
    if options.case != "all" and not options.quick and json_path.exists():  # keep the cases not run this time
        runs += [r for r in json.loads(json_path.read_text())["runs"] if r["case"]["name"] not in names]
    result = {"device_time": DEVICE_TIME, "cpus": os.cpu_count(), "python": platform.python_version(), "runs": runs}
    write_results(result, json_path, options.out / "multi_host_bench.md", markdown(result))
    return result


if __name__ == "__main__":
    main()
