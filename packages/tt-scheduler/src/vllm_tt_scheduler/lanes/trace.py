"""Step trace of the lane coordinator: the single scheduler's line, plus a per-lane breakdown.

The top-level keys are those of ``trace.JsonlStepTrace`` (summed over lanes), so tools reading
a single-scheduler trace read this one too; ``lanes`` holds each lane's own slice. Off unless
``TT_STEP_TRACE`` is set; then the null object does nothing and no field is computed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.trace import JsonlFile, QueueProbe, QueueSnapshot, StepOutput, step_fields


class _Idle:
    """The slice of a lane that ran no pass this step."""

    num_scheduled_tokens: dict[str, int] = {}
    finished_req_ids: set[str] = set()
    preempted_req_ids: set[str] | None = None


_IDLE = _Idle()


class LaneStepTrace(Protocol):
    def record(self, step: int, phase: Phase, output: StepOutput, lane_outputs: Sequence[StepOutput | None],
               lanes: Sequence[QueueProbe], retried: bool) -> None: ...

    def close(self) -> None: ...


class NullLaneTrace:
    """Tracing off."""

    def record(self, step: int, phase: Phase, output: StepOutput, lane_outputs: Sequence[StepOutput | None],
               lanes: Sequence[QueueProbe], retried: bool) -> None:
        return None

    def close(self) -> None:
        return None


class JsonlLaneTrace(JsonlFile):
    """One JSON object per engine step: the merged step's keys, queues summed over lanes."""

    def record(self, step: int, phase: Phase, output: StepOutput, lane_outputs: Sequence[StepOutput | None],
               lanes: Sequence[QueueProbe], retried: bool) -> None:
        if self.closed:
            return
        snaps = [probe.snapshot() for probe in lanes]
        total = QueueSnapshot(
            sum(s.num_waiting for s in snaps), sum(s.num_running for s in snaps),
            sum(s.kv_blocks_used for s in snaps), sum(s.kv_blocks_total for s in snaps),
        )
        self.write({
            "step": step,
            "phase": phase.value,
            **step_fields(output, total),
            "retried": retried,
            "lanes": [step_fields(out or _IDLE, snap) for out, snap in zip(lane_outputs, snaps, strict=True)],
        })


def open_lane_trace(path: str | None) -> LaneStepTrace:
    return JsonlLaneTrace(path) if path else NullLaneTrace()
