"""One lane of the coordinator: a phase scheduler whose phase is chosen from outside.

``TTScheduler.schedule()`` picks its own phase. Lanes must all run the same phase in a step, so
the coordinator needs the parts of that method one at a time: the lane's work (``lane_view``),
one pass of a given phase (``lane_pass``), whether an empty step has work in the other phase
(``lane_fallback``), the admission back-off (``lane_admission_blocked``), and the bookkeeping
once the step's phase is known (``lane_end_step``). This module is the only place that reaches
into the phase scheduler's internals; a public hook there would replace it.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.output import SchedulerOutput

from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import WorkView
from vllm_tt_scheduler.scheduler import PhaseScheduling, TTAsyncScheduler, TTScheduler
from vllm_tt_scheduler.trace import NullStepTrace


class LaneMember(PhaseScheduling):
    """The per-step hooks the lane coordinator drives a phase scheduler with."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The coordinator writes one trace line per step with every lane in it.
        self._trace.close()
        self._trace = NullStepTrace()

    def lane_view(self) -> WorkView:
        """This lane's work; also sizes the token budget of its next prefill pass."""
        return self._work_view()

    def lane_pass(self, phase: Phase, throttle_prefills: bool, retry: bool = False) -> SchedulerOutput:
        """One vLLM scheduling pass showing only ``phase``'s work (EMPTY: a prefill pass).

        ``retry``: this pass replaces one whose output is discarded, in the same engine step.
        """
        if retry:
            self.current_step -= 1
        return self._run_pass(phase, throttle_prefills)

    def lane_fallback(self, plan: Phase) -> Phase | None:
        """The phase to redo an empty step with, if this lane has work in it."""
        return self._fallback(plan)

    def lane_admission_blocked(self) -> None:
        """A prefill pass this lane expected to admit admitted nothing: back off (see
        ``TTScheduler``), so the next steps do not pay for the same failed pass."""
        self._remember_blocked_admission()

    def lane_end_step(self, phase: Phase) -> None:
        """Record the phase this lane's slice of the step ended up with."""
        if phase is Phase.PREFILL:
            self._blocked_free_blocks = None
        self.last_phase = phase
        self._step_index += 1


class TTLaneScheduler(LaneMember, TTScheduler):
    """A lane for synchronous scheduling."""


class TTAsyncLaneScheduler(LaneMember, TTAsyncScheduler):
    """A lane for async scheduling (vLLM's ``AsyncScheduler`` underneath)."""
