"""The engine side of the TT metrics: the runner records each step; a background thread
sends the deltas to the API servers.

The runner's per-step cost is a few dict increments under an uncontended lock; encoding and
sending happen on the ``tt-metrics`` thread every ``interval_s``. A delta no API server took yet
(none connected) is kept and merged into the next one, so no step is lost. With metrics off the
runner holds ``NULL_STEP_METRICS``, which does nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol

import zmq

from vllm_tt_platform.metrics.wire import ENCODER, MAX_OBSERVATIONS, StepDelta, engine_address

FLUSH_INTERVAL_S = 0.25


class OverlapCounts(Protocol):
    """What the metrics read of the runner's ``OverlapStats`` (running totals)."""

    @property
    def submitted(self) -> int: ...
    @property
    def overlapped(self) -> int: ...
    @property
    def drains(self) -> Mapping[str, int]: ...
    @property
    def not_overlapped(self) -> Mapping[str, int]: ...
    @property
    def discarded_tokens(self) -> int: ...


class StepMetrics(Protocol):
    def step(self, phase: str, *, tokens: int, rows_used: int, rows: int, sampling: str) -> None:
        """One engine step that ran the model: its phase, scheduled tokens, rows holding a
        request and rows of the fixed batch, and where it sampled (``"<path>:<reason>"``)."""
        ...

    def close(self) -> None: ...


class NullStepMetrics:
    """TT metrics off (offline ``vllm.LLM``, ``--disable-log-stats``): records nothing."""

    def step(self, phase: str, *, tokens: int, rows_used: int, rows: int, sampling: str) -> None:
        pass

    def close(self) -> None:
        pass


NULL_STEP_METRICS = NullStepMetrics()


def overlap_totals(stats: OverlapCounts) -> dict[str, int]:
    """``OverlapStats`` as the wire's flat keys (running totals)."""
    totals = {"submitted": stats.submitted, "overlapped": stats.overlapped,
              "discarded_tokens": stats.discarded_tokens}
    totals.update({f"drained:{r}": n for r, n in dict(stats.drains).items()})
    totals.update({f"sync:{r}": n for r, n in dict(stats.not_overlapped).items()})
    return totals


class EngineMetrics:
    def __init__(self, address: str, *, rows_per_lane: int, lane_rows_used: Callable[[], list[int]],
                 overlap: OverlapCounts, device_seconds: Callable[[], float] | None = None,
                 interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.address = address
        self.rows_per_lane = rows_per_lane
        self._lane_rows_used = lane_rows_used
        self._overlap = overlap
        self._device_seconds = device_seconds
        self._last_device = device_seconds() if device_seconds is not None else 0.0
        self._last_phase: str | None = None
        self._lock = threading.Lock()
        self._delta = StepDelta()
        self._pending = StepDelta()
        """Flushed but not yet taken by an API server."""
        self._sent_overlap: dict[str, int] = {}
        self._sent_lanes: list[int] | None = None
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, 10_000)
        self._socket.bind(address)
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tt-metrics", daemon=True)
        self._thread.start()

    def step(self, phase: str, *, tokens: int, rows_used: int, rows: int, sampling: str) -> None:
        device_s = None
        if self._device_seconds is not None:
            now = self._device_seconds()
            device_s, self._last_device = now - self._last_device, now
        previous, self._last_phase = self._last_phase, phase
        with self._lock:
            delta = self._delta
            delta.steps[phase] = delta.steps.get(phase, 0) + 1
            if phase == "prefill":
                if len(delta.prefill_tokens) < MAX_OBSERVATIONS:
                    delta.prefill_tokens.append(tokens)
            else:
                delta.decode_rows_used += rows_used
                delta.decode_rows += rows
            delta.sampling[sampling] = delta.sampling.get(sampling, 0) + 1
            if device_s is not None and previous is not None:
                # Device time between the starts of two steps belongs to the earlier step (exact
                # for synchronous steps; with overlapped decode it trails by the queue depth).
                delta.device_s.setdefault(previous, []).append(device_s)

    def flush(self) -> bool:
        """Send what was recorded since the last flush; False if no API server took it yet."""
        totals = overlap_totals(self._overlap)
        overlap = {k: n - self._sent_overlap.get(k, 0) for k, n in totals.items()
                   if n != self._sent_overlap.get(k, 0)}
        self._sent_overlap = totals
        lanes = self._lane_rows_used()
        with self._lock:
            delta, self._delta = self._delta, StepDelta()
        delta.overlap = overlap
        if lanes != self._sent_lanes:
            delta.lane_rows_used, delta.rows_per_lane = lanes, self.rows_per_lane
            self._sent_lanes = lanes
        self._pending.merge(delta)
        if self._pending.empty():
            return True
        try:
            self._socket.send(ENCODER.encode(self._pending), zmq.NOBLOCK)
        except zmq.Again:
            return False
        self._pending = StepDelta()
        return True

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.flush()

    def close(self) -> None:
        """Send the last delta (waiting up to a second for an API server) and close."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.flush()
        self._socket.close(linger=1000)
        self._context.term()


def open_step_metrics(engine_index: int, *, rows_per_lane: int, lane_rows_used: Callable[[], list[int]],
                      overlap: OverlapCounts, device_seconds: Callable[[], float] | None) -> StepMetrics:
    """``EngineMetrics`` when the front end asked for TT metrics (``VLLM_TT_METRICS``), else the
    null object."""
    address = engine_address(engine_index)
    if address is None:
        return NULL_STEP_METRICS
    return EngineMetrics(address, rows_per_lane=rows_per_lane, lane_rows_used=lane_rows_used,
                         overlap=overlap, device_seconds=device_seconds)
