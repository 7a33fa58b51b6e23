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


class _Output(Protocol):
    num_scheduled_tokens: dict[str, int]
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None


class StepTrace(Protocol):
    """Receives every scheduled step."""

    def record(self, step: int, phase: Phase, output: _Output, queues: QueueProbe, retried: bool) -> None: ...

    def close(self) -> None: ...


class QueueProbe(Protocol):
    """Where a trace reads queue sizes; called only when a trace is on."""

    def snapshot(self) -> QueueSnapshot: ...


class NullStepTrace:
    """Tracing off: every call is a no-op."""

    def record(self, step: int, phase: Phase, output: _Output, queues: QueueProbe, retried: bool) -> None:
        return None

    def close(self) -> None:
        return None


class JsonlStepTrace:
    """Writes one JSON object per step to a file (line-buffered, so a crash keeps it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def record(self, step: int, phase: Phase, output: _Output, queues: QueueProbe, retried: bool) -> None:
        if self._file is None:
            return
        snap = queues.snapshot()
        line = {
            "step": step,
            "phase": phase.value,
            "scheduled": dict(sorted(output.num_scheduled_tokens.items())),
            "num_waiting": snap.num_waiting,
            "num_running": snap.num_running,
            "preempted": sorted(output.preempted_req_ids or ()),
            "finished": sorted(output.finished_req_ids),
            "kv_blocks_used": snap.kv_blocks_used,
            "kv_blocks_total": snap.kv_blocks_total,
            "retried": retried,
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def open_step_trace(path: str | None) -> StepTrace:
    """The trace for ``path``; the null trace when there is none."""
    return JsonlStepTrace(path) if path else NullStepTrace()
