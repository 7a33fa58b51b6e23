"""Warmup that reports: each compile or capture pass the runner asks of the model is logged
with its shapes and the time it took, then a summary with the total, before ``/health`` is OK.

A real mesh spends minutes here; without these lines the server looks hung. (The host device
also logs each trace it captures, with the trace's shape.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from vllm.logger import init_logger

logger = init_logger("vllm." + __name__)


@dataclass
class WarmupReport:
    passes: list[tuple[str, float]] = field(default_factory=list)
    """(what, seconds) per warmup call, in order."""

    @contextlib.contextmanager
    def timed(self, what: str) -> Iterator[None]:
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        self.passes.append((what, seconds))
        logger.info("TT warmup: %s in %.2f s", what, seconds)

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.passes)

    def log_summary(self) -> None:
        logger.info("TT warmup done: %d passes in %.2f s", len(self.passes), self.total_s)
