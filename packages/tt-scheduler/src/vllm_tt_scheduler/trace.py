"""Step trace: one JSON line per engine step, for debugging and for tests.

Off by default. The scheduler always calls ``trace.record(...)``; when tracing is off
that call lands on ``NullStepTrace``, which does nothing, so no field is ever computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, Protocol

from vllm_tt_scheduler.phase import Phase


@dataclass(frozen=True)
class QueueSnapshot:
    """Queue sizes and KV use after a step was scheduled."""

    num_waiting: int
    num_running: int
    kv_blocks_used: int
    kv_blocks_total: int


class StepOutput(Protocol):
    """What a trace reads of a scheduler output."""

    num_scheduled_tokens: dict[str, int]
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None


class StepTrace(Protocol):
    """Receives every scheduled step."""

    def record(self, step: int, phase: Phase, output: StepOutput, queues: QueueProbe, retried: bool) -> None: ...

    def close(self) -> None: ...


class QueueProbe(Protocol):
    """Where a trace reads queue sizes; called only when a trace is on."""

    def snapshot(self) -> QueueSnapshot: ...


class NullStepTrace:
    """Tracing off: every call is a no-op."""

    def record(self, step: int, phase: Phase, output: StepOutput, queues: QueueProbe, retried: bool) -> None:
        return None

    def close(self) -> None:
        return None


def step_fields(output: StepOutput, snap: QueueSnapshot) -> dict[str, object]:
    """What one scheduler output did and the queues it left, as trace keys (also the lane
    trace's per-lane slice, so the two read alike)."""
    return {
        "scheduled": dict(sorted(output.num_scheduled_tokens.items())),
        "num_waiting": snap.num_waiting,
        "num_running": snap.num_running,
        "preempted": sorted(output.preempted_req_ids or ()),
        "finished": sorted(output.finished_req_ids),
        "kv_blocks_used": snap.kv_blocks_used,
        "kv_blocks_total": snap.kv_blocks_total,
    }


class JsonlFile:
    """A trace file with one JSON object per line (line-buffered, so a crash keeps it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    @property
    def closed(self) -> bool:
        return self._file is None

    def write(self, line: dict[str, object]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class JsonlStepTrace(JsonlFile):
    """Writes one JSON object per step to a file."""

    def record(self, step: int, phase: Phase, output: StepOutput, queues: QueueProbe, retried: bool) -> None:
        if self.closed:
            return
        self.write({"step": step, "phase": phase.value, **step_fields(output, queues.snapshot()), "retried": retried})


def open_step_trace(path: str | None) -> StepTrace:
    """The trace for ``path``; the null trace when there is none."""
    return JsonlStepTrace(path) if path else NullStepTrace()
