"""The lane classes of the coordinator: phase schedulers whose phase is chosen from outside.

``TTScheduler.schedule()`` picks its own phase. Lanes must all run the same phase in a step, so
the coordinator drives each lane through the public steps ``schedule()`` is made of
(``PhaseScheduling.work_view``, ``run_pass``, ``fallback_phase``, ``admission_blocked``,
``end_step``). A lane neither logs its policy nor writes a step trace: the coordinator does,
once for all lanes.
"""

from __future__ import annotations

from vllm_tt_scheduler.scheduler import TTAsyncScheduler, TTScheduler


class TTLaneScheduler(TTScheduler):
    """A lane for synchronous scheduling."""

    coordinated = True


class TTAsyncLaneScheduler(TTAsyncScheduler):
    """A lane for async scheduling (vLLM's ``AsyncScheduler`` underneath)."""

    coordinated = True
