"""The synthetic workload of the scheduler benchmarks (``scheduler_bench.py``, ``lanes_bench.py``).

A trace of Poisson arrivals in engine steps, and a driver that feeds it to one scheduler in the
simulator (``vllm_tt_testing.scheduler_sim``, no model), a chunk of steps at a time, so that several
schedulers can run in turn on the same trace and machine noise hits them alike.
"""

from __future__ import annotations

import gc
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TraceSpec:
    """The synthetic workload."""

    num_requests: int = 2000
    prompt_min: int = 16
    prompt_max: int = 1024
    output_min: int = 8
    output_max: int = 256
    load: float = 0.9
    """Arrival rate as a fraction of saturation: rows / mean output length, the requests per
    step a scheduler with that many rows can finish at best."""
    seed: int = 0


@dataclass(frozen=True)
class Arrival:
    step: int
    req_id: str
    prompt_len: int
    output_len: int


def make_trace(spec: TraceSpec, rows: int) -> list[Arrival]:
    """Poisson arrivals, in engine steps, at ``spec.load`` of the saturation of ``rows``."""
    rng = random.Random(spec.seed)
    rate = spec.load * rows / ((spec.output_min + spec.output_max) / 2)
    clock = 0.0
    arrivals = []
    for i in range(spec.num_requests):
        clock += rng.expovariate(rate)
        arrivals.append(Arrival(int(clock), f"r{i}", rng.randint(spec.prompt_min, spec.prompt_max),
                                rng.randint(spec.output_min, spec.output_max)))
    return arrivals


@dataclass(frozen=True)
class TokenTimes:
    """When the requests of a finished run got their tokens, in engine steps."""

    ttft_steps: float
    """Mean time to first token, from arrival (the arrival step counts)."""
    itl_steps: float
    """Mean interval between two tokens of one request."""
    max_gap_steps: int
    """Longest wait between two tokens of one request (the worst decode stall)."""
    tokens: int


class TraceDriver:
    """Feeds a trace to one simulated engine; subclasses build the engine and the result."""

    def __init__(self, sim: Any, trace: Sequence[Arrival]) -> None:
        self.sim = sim
        self.pending = list(reversed(trace))
        self.phases: Counter[Any] = Counter()
        """Steps by phase (``None``: a mixed step)."""
        self.preemptions = 0

    @property
    def done(self) -> bool:
        return not self.pending and not self.sim.has_work()

    def advance(self, steps: int) -> None:
        from vllm_tt_testing.scheduler_sim import make_request

        sim, pending = self.sim, self.pending
        for _ in range(steps):
            if self.done:
                return
            while pending and self.due(pending[-1]):
                arrival = pending.pop()
                sim.add(make_request(arrival.req_id, arrival.prompt_len, arrival.output_len))
            if not sim.has_work():
                self.idle(pending[-1])
                continue
            record = sim.step()
            if record is not None:
                self.phases[record.phase] += 1
                self.preemptions += len(record.preempted)
                self.stepped(record)

    def due(self, arrival: Arrival) -> bool:
        """Whether ``arrival`` has arrived by now (the clock is the engine's step index)."""
        return arrival.step <= self.sim.step_index

    def idle(self, upcoming: Arrival) -> None:
        """Nothing to do until ``upcoming`` arrives: time passes one step."""
        self.sim.step_index += 1

    def stepped(self, record: Any) -> None:
        """Called after each engine step with its ``sim.StepRecord``."""

    def token_times(self) -> TokenTimes:
        ttfts, gaps, intervals, max_gap = [], 0, 0, 0
        for log in self.sim.logs.values():
            if log.finishes != 1 or not log.token_steps:
                raise RuntimeError(f"request did not finish exactly once: {log}")
            steps = log.token_steps
            ttfts.append(steps[0] - log.arrival_step + 1)
            gaps += steps[-1] - steps[0]
            intervals += len(steps) - 1
            max_gap = max([max_gap, *(b - a for a, b in zip(steps, steps[1:], strict=False))])
        return TokenTimes(statistics.fmean(ttfts), gaps / max(intervals, 1), max_gap, intervals + len(ttfts))

    def result(self) -> Any:
        raise NotImplementedError


def run_alternating(drivers: Sequence[TraceDriver], chunk: int = 32) -> list[Any]:
    """Run the drivers to completion, ``chunk`` steps each in turn, so that a change in machine
    load (other processes) hits all of them alike; returns their results."""
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()  # a collection would land on a random step of either side
    try:
        while not all(driver.done for driver in drivers):
            for driver in drivers:
                driver.advance(chunk)
    finally:
        if gc_was_enabled:
            gc.enable()
    return [driver.result() for driver in drivers]
