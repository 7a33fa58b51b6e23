"""Step trace of the lane coordinator: the single scheduler's line, plus a per-lane breakdown.

The top-level keys are those of ``trace.JsonlStepTrace`` (summed over lanes), so tools reading
a single-scheduler trace read this one too; ``lanes`` holds each lane's own slice. Off unless
``TT_STEP_TRACE`` is set; then the null object does nothing and no field is computed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import IO, Protocol

from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.trace import QueueProbe


class _Output(Protocol):
    num_scheduled_tokens: dict[str, int]
    finished_req_ids: set[str]
    preempted_req_ids: set[str] | None


class LaneStepTrace(Protocol):
    def record(self, step: int, phase: Phase, output: _Output, lane_outputs: Sequence[_Output],
               lanes: Sequence[QueueProbe], retried: bool) -> None: ...

    def close(self) -> None: ...


class NullLaneTrace:
    """Tracing off."""

    def record(self, step: int, phase: Phase, output: _Output, lane_outputs: Sequence[_Output],
               lanes: Sequence[QueueProbe], retried: bool) -> None:
        return None

    def close(self) -> None:
        return None


def _slice(output: _Output, probe: QueueProbe) -> dict[str, object]:
    snap = probe.snapshot()
    return {
        "scheduled": dict(sorted(output.num_scheduled_tokens.items())),
        "num_waiting": snap.num_waiting,
        "num_running": snap.num_running,
        "preempted": sorted(output.preempted_req_ids or ()),
        "finished": sorted(output.finished_req_ids),
        "kv_blocks_used": snap.kv_blocks_used,
        "kv_blocks_total": snap.kv_blocks_total,
    }


class JsonlLaneTrace:
    """One JSON object per engine step, line-buffered (a crash keeps what was written)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[str] | None = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

    def record(self, step: int, phase: Phase, output: _Output, lane_outputs: Sequence[_Output],
               lanes: Sequence[QueueProbe], retried: bool) -> None:
        if self._file is None:
            return
        slices = [_slice(lane_output, probe) for lane_output, probe in zip(lane_outputs, lanes, strict=True)]
        line = {
            "step": step,
            "phase": phase.value,
            "scheduled": dict(sorted(output.num_scheduled_tokens.items())),
            "num_waiting": sum(s["num_waiting"] for s in slices),  # type: ignore[misc]
            "num_running": sum(s["num_running"] for s in slices),  # type: ignore[misc]
            "preempted": sorted(output.preempted_req_ids or ()),
            "finished": sorted(output.finished_req_ids),
            "kv_blocks_used": sum(s["kv_blocks_used"] for s in slices),  # type: ignore[misc]
            "kv_blocks_total": sum(s["kv_blocks_total"] for s in slices),  # type: ignore[misc]
            "retried": retried,
            "lanes": slices,
        }
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def open_lane_trace(path: str | None) -> LaneStepTrace:
    return JsonlLaneTrace(path) if path else NullLaneTrace()
