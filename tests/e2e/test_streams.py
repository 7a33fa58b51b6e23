"""Many concurrent streams against one ``vllm serve``: 200 greedy streams at once, a quarter cut
by the client at random points. Every stream that finishes is complete (one finish reason,
``[DONE]`` last) and equal to the same request sent alone, and the server drains to nothing
running or waiting with no KV block in use. ``nox -s streams`` runs 1,000
(``benchmarks/streams.py``, docs/reliability.md).
"""

from __future__ import annotations

import asyncio

import pytest
from vllm_tt_testing import traffic

from tests.e2e.helpers import living_group_members, serve_process

pytestmark = pytest.mark.e2e

STREAMS = 200
SERVER = ("--served-model-name", traffic.MODEL, "--max-num-seqs", "16", "--max-model-len", "256")


def test_two_hundred_concurrent_streams_are_exact_and_the_server_drains(tiny_checkpoint, tmp_path):
    traffic.raise_fd_limit()
    specs = traffic.stream_specs(STREAMS, seed=0)
    with serve_process(tiny_checkpoint("llama"), *SERVER, log=tmp_path / "serve.log") as server:
        run = asyncio.run(traffic.run_streams(server.url, specs, lambda: living_group_members(server.process.pid)))
    print(f"\n[streams] {run.streams} streams in {run.elapsed_s:.1f}s: {run.finished} finished, "
          f"{run.cancelled} cancelled; peak open fds {run.peak_open_fds}; drained {run.drained}")
    assert run.problems == []
    cut = sum(s.cancel_after is not None for s in specs)
    assert run.finished + run.cancelled == STREAMS
    assert run.cancelled <= cut and run.finished >= STREAMS - cut  # a cut stream may finish first
    assert (run.drained.running, run.drained.waiting, run.drained.kv_usage) == (0, 0, 0), run.drained
