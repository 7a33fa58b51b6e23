"""Thread pools sized for the machine the suite shares: one share of the cores per pytest-xdist
worker, for the worker and the engines it starts, and one numba thread everywhere.

torch sizes its thread pool to every core of the machine in every process. Two workers that each
train a tiny model or run an engine then ask for twice the cores there are, and the spinning
OpenMP threads slow both down several times over (measured on the 2-core machine: two tiny-model
trainings at once took 137 s and 192 s with torch's default threads, 20 s and 30 s with one
thread each). So each worker gets ``cores // workers`` threads (at least one), set in its
environment before torch is imported; ``vllm serve`` and ``vllm.LLM`` engine processes inherit
it. A thread count the user set is kept; a serial run keeps torch's default.

vLLM's n-gram proposer runs numba with one thread, but numba starts an OpenMP pool of one thread
per core, whose spinning starves the engine's own torch work: 200 four-token n-gram requests on
the host backend took 62 s with numba's default pool and 2.3 s with ``NUMBA_NUM_THREADS=1``
(the machine loaded). So every run sets that.
"""

from __future__ import annotations

import os
import sys

import pytest

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
NUMBA_THREADS = "NUMBA_NUM_THREADS"


def threads_per_worker(cores: int, workers: int) -> int:
    return max(1, cores // max(1, workers))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(NUMBA_THREADS, "1")
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or os.environ.get("OMP_NUM_THREADS"):
        return
    threads = threads_per_worker(os.cpu_count() or 1, int(workerinput["workercount"]))
    for name in THREAD_VARS:
        os.environ[name] = str(threads)
    if "torch" in sys.modules:  # imported by a conftest before this hook: resize its pool too
        sys.modules["torch"].set_num_threads(threads)
