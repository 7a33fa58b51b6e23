"""Fault injectors for the overlapped-decode hooks (``vllm_tt_platform.faults``).

``RandomFaults`` sleeps at random points and races finalisation from another thread, like
vLLM's output thread in a multi-process worker; ``ScriptedFaults`` sleeps exactly where a test
says and records the order points were reached in. Tests install them on the runner's overlap
and on the host mesh device.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from vllm_tt_platform.faults import DelayPoint, Faults


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
