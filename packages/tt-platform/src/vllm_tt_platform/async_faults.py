"""Injected delays for overlapped decode: stretch chosen points of a step's life to provoke the
thread orderings that break naive implementations.

Production code calls ``faults.delay(point)`` at each point and ``faults.race(finalise)`` after
each overlapped submission; the default ``NO_FAULTS`` does nothing. Tests install
``RandomFaults`` (seeded random sleeps, plus finalisation raced from another thread, like vLLM's
output thread in a multi-process worker) or ``ScriptedFaults`` (exact sleeps for exact
occurrences) on the runner's overlap and on the host mesh device.
"""

from __future__ import annotations

import contextlib
import enum
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field


class DelayPoint(enum.Enum):
    SUBMIT = "submit"
    """Runner: the decode program was submitted, its readback not yet started."""
    READBACK = "readback"
    """Device: a readback is about to complete (its event not yet recorded)."""
    FINALISE = "finalise"
    """Finaliser (any thread): inside the exactly-once section, before waiting on events."""
    APPLY = "apply"
    """Runner: a finalised step is about to be applied to the host batch."""


class Faults:
    """No faults: the null object every component starts with."""

    def delay(self, point: DelayPoint) -> None:
        """Called when execution reaches ``point``."""

    def race(self, finalise: Callable[[], object]) -> None:
        """Called once per overlapped step with a callable that finalises it."""


NO_FAULTS = Faults()


@dataclass
class RandomFaults(Faults):
    """Seeded random sleeps at ``points``; with ``race_probability``, a step is also finalised
    from a fresh thread after a random sleep, competing with the engine's own call."""

    seed: int = 0
    max_delay_s: float = 0.002
    points: frozenset[DelayPoint] = frozenset(DelayPoint)
    delay_probability: float = 0.5
    race_probability: float = 0.5
    sleep: Callable[[float], None] = time.sleep
    _rng: random.Random = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    races: list[threading.Thread] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def _draw(self, probability: float) -> float | None:
        with self._lock:
            if self._rng.random() >= probability:
                return None
            return self._rng.uniform(0.0, self.max_delay_s)

    def delay(self, point: DelayPoint) -> None:
        if point in self.points:
            pause = self._draw(self.delay_probability)
            if pause is not None:
                self.sleep(pause)

    def race(self, finalise: Callable[[], object]) -> None:
        pause = self._draw(self.race_probability)
        if pause is None:
            return

        def run() -> None:
            self.sleep(pause)
            _quietly(finalise)

        thread = threading.Thread(target=run, name="tt-raced-finalise", daemon=True)
        with self._lock:
            self.races = [t for t in self.races if t.is_alive()]
            self.races.append(thread)
        thread.start()

    def join(self) -> None:
        """Wait for every raced finalisation (tests call this before checking results)."""
        with self._lock:
            threads = list(self.races)
        for thread in threads:
            thread.join()


@dataclass
class ScriptedFaults(Faults):
    """Exact sleeps: ``delays[(point, n)]`` seconds at the n-th (0-based) time ``point`` is
    reached; ``events`` records every point reached, in order, for ordering assertions."""

    delays: Mapping[tuple[DelayPoint, int], float] = field(default_factory=dict)
    race_steps: Iterable[int] = ()
    """Overlapped steps (0-based submission order) finalised by a raced thread at once."""
    sleep: Callable[[float], None] = time.sleep
    events: list[tuple[DelayPoint, int]] = field(default_factory=list)
    _counts: Counter[DelayPoint] = field(default_factory=Counter, init=False, repr=False)
    _races: int = field(default=0, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    threads: list[threading.Thread] = field(default_factory=list, init=False, repr=False)

    def delay(self, point: DelayPoint) -> None:
        with self._lock:
            n = self._counts[point]
            self._counts[point] += 1
            self.events.append((point, n))
        pause = self.delays.get((point, n), 0.0)
        if pause:
            self.sleep(pause)

    def race(self, finalise: Callable[[], object]) -> None:
        with self._lock:
            n = self._races
            self._races += 1
        if n in set(self.race_steps):
            thread = threading.Thread(target=_quietly, args=(finalise,), name=f"tt-raced-finalise-{n}", daemon=True)
            self.threads.append(thread)
            thread.start()


def _quietly(finalise: Callable[[], object]) -> None:
    """Run a raced finalisation; an error stays with the step, which raises it to its owner."""
    with contextlib.suppress(Exception):
        finalise()
