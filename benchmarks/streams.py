"""1,000 concurrent streaming requests against one ``vllm serve`` on the host backend.

A quarter of the streams are cut by the client at random points. Pass: every finished stream
complete and equal to the same request sent alone, nothing duplicated, ``/metrics`` drained to
0 running / 0 waiting / 0 KV after; the open-file limit met is reported (docs/reliability.md).
The CI suite runs 200 (``tests/e2e/test_streams.py``).

    python benchmarks/streams.py [--streams 1000] [--max-num-seqs 32]

Writes benchmarks/results/streams.json and streams.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "testing")]

import vllm_tt_testing.traffic as traffic  # noqa: E402
from report import write_results  # noqa: E402

from tests.e2e.helpers import living_group_members, serve_process  # noqa: E402

RESULTS = Path(__file__).parent / "results"


def markdown(r: dict) -> str:
    run = r["run"]
    return "\n".join([
        f"# {run['streams']} concurrent streams ({r['date']})", "",
        f"`{r['command']}`", "",
        "| figure | value |", "|---|---|",
        f"| streams (cut by the client: {r['cut']}) | {run['streams']} |",
        f"| finished, complete and exact | {run['finished']} |",
        f"| cancelled before the end | {run['cancelled']} |",
        f"| problems | {len(run['problems'])} |",
        f"| wall time | {run['elapsed_s']:.1f} s |",
        f"| drained after (running / waiting / KV) | {run['drained']['running']:g} / "
        f"{run['drained']['waiting']:g} / {run['drained']['kv_usage']:g} |",
        f"| open-file limit (soft, hard) | {r['fd_limit'][0]}, {r['fd_limit'][1]} |",
        f"| peak open fds | {', '.join(f'{k}: {v}' for k, v in sorted(run['peak_open_fds'].items()))} |",
        f"| result | {'PASS' if r['passed'] else 'FAIL'} |", "",
    ] + [f"- {p}" for p in run["problems"][:20]]) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    from vllm_tt_host.tiny import build_tiny_checkpoint

    fd_limit = traffic.raise_fd_limit()
    specs = traffic.stream_specs(args.streams, args.seed)
    with tempfile.TemporaryDirectory(prefix="tt-streams-") as tmp:
        model = Path(build_tiny_checkpoint("llama", Path(tmp) / "llama", train_steps=0, seed=0))
        with serve_process(model, "--served-model-name", traffic.MODEL, "--max-num-seqs", str(args.max_num_seqs),
                           "--max-model-len", "256", log=Path(tmp) / "serve.log") as server:
            run = asyncio.run(traffic.run_streams(server.url, specs,
                                                  lambda: living_group_members(server.process.pid)))
    drained = (run.drained.running, run.drained.waiting, run.drained.kv_usage) == (0, 0, 0)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": "python benchmarks/streams.py " + " ".join(sys.argv[1:]),
        "fd_limit": list(fd_limit), "cut": sum(s.cancel_after is not None for s in specs),
        "run": asdict(run), "passed": not run.problems and drained and run.finished + run.cancelled == len(specs),
    }
    write_results(result, args.out / "streams.json", args.out / "streams.md", markdown(result))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
