"""Progress lines for the tiny model's training, so a first demo start says how long it has left."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

REPORT_SECONDS = 10.0
"""A line this often, besides one after ``FIRST_REPORT`` steps (an early ETA) and one at the end."""
FIRST_REPORT = 10


class TrainingProgress:
    """Reports ``step/steps``, percent, loss, time so far and the ETA at the pace so far."""

    def __init__(self, steps: int, *, out: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        self.steps, self._out, self._clock = steps, out or sys.stderr, clock
        self._start = self._last = clock()
        self._print(f"tiny model: training {steps} steps on the shipped corpus")

    def step(self, step: int, loss: Callable[[], float]) -> None:
        """After optimizer step ``step`` (1-based); ``loss`` is read only when a line is due."""
        now = self._clock()
        if step in (FIRST_REPORT, self.steps) or now - self._last >= REPORT_SECONDS:
            self._last = now
            self._print(line(step, self.steps, now - self._start, loss()))

    def _print(self, text: str) -> None:
        print(text, file=self._out, flush=True)


def line(step: int, steps: int, elapsed: float, loss: float) -> str:
    left = elapsed / step * (steps - step)
    return (f"tiny model: training step {step}/{steps} ({100 * step // steps} %), loss {loss:.2f}, "
            f"{_clock(elapsed)} elapsed, ETA {_clock(left)}")


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"
