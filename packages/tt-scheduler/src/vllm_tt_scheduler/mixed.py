"""Mixed steps: the running decodes and one prompt chunk in one step, for a model that captures
programs of those shapes (``SchedulerOptions.mixed_shapes``, ``(decode rows, chunk tokens)``).

A mixed step replaces the prefill step that would stall the decodes and the weight pass the
decodes would then need of their own. The chunk is sized from the captured shapes, not from a
token budget: the smallest chunk of a shape holding the step's decode rows that covers what the
prompt still needs, else that shape's largest; with an ITL target (``tt.itl_slo_ms``, the
SLO-aware policy) only chunks whose modelled step fits the target are candidates (the smallest
always is, so a prompt still progresses). As the phase passes do, one vLLM ``schedule()``
call builds the step from what it is shown: the decodes and at most one prompt (the oldest
partial prefill, or, with none, one admission), with a token budget of one token per decode
plus the chunk. Steps with verify rows or block output never mix: the platform refuses
``tt.mixed_steps`` beside speculation, block output and lanes at startup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from vllm_tt_scheduler.passes import still_on_runner
from vllm_tt_scheduler.phase import Phase

Schedule = Callable[[], SchedulerOutput]


@dataclass(frozen=True)
class MixedShapes:
    """The model's captured ``(decode rows, chunk tokens)`` programs."""

    shapes: tuple[tuple[int, int], ...]

    def chunk_for(self, decodes: int, need: int | None, fits: Callable[[int], bool] | None = None) -> int | None:
        """The chunk of a mixed step beside ``decodes`` decode rows for a prompt that still needs
        ``need`` tokens (None: not known), or None when no shape holds that many decode rows.
        ``fits``: whether a step with that chunk meets the ITL target (None: every chunk does)."""
        rows = [d for d, _ in self.shapes if d >= decodes]
        if not rows:
            return None
        chunks = sorted(c for d, c in self.shapes if d == min(rows))
        if fits is not None:
            chunks = [c for c in chunks if fits(c)] or chunks[:1]
        return next((c for c in chunks if need is not None and c >= need), chunks[-1])

    def describe(self) -> str:
        """The startup log's words for the shapes."""
        return ", ".join(f"{d} decode rows + {c} tokens" for d, c in self.shapes)


def mixed_pass(sched: Scheduler, schedule: Schedule, partials: list[Request], chunk_tokens: int) -> SchedulerOutput:
    """Run ``schedule`` seeing the running decodes and one prompt: the first of ``partials``
    (the others hidden) or, with none, one admission; the step budget is one token per decode
    plus ``chunk_tokens``. The prompt is shown last, so the decodes take their tokens first."""
    owner, hidden = (partials[0], partials[1:]) if partials else (None, [])
    shown = set(partials)
    running = [request for request in sched.running if request not in shown]
    decodes = len(running)
    if owner is not None:
        running.append(owner)
    sched.running = running
    active, budget = sched.max_num_active_reqs, sched.max_num_scheduled_tokens
    sched.max_num_running_reqs -= len(hidden)
    # An admission only when no partial prefill is shown: one prompt per step.
    room = 0 if owner is not None else 1
    sched.max_num_active_reqs = min(active - len(hidden), len(running) + sched.num_waiting_for_streaming_input + room)
    sched.max_num_scheduled_tokens = min(budget, decodes + chunk_tokens)
    try:
        return schedule()
    finally:
        sched.max_num_scheduled_tokens = budget
        sched.max_num_active_reqs = active
        sched.max_num_running_reqs += len(hidden)
        if hidden:
            sched.running.extend(hidden)
            still_on_runner(sched, hidden)


def scheduled_phase(output: SchedulerOutput, owner: Request | None) -> Phase:
    """What a mixed pass's output holds: the prompt's chunk (a new, resumed or partial row) and
    decode rows (MIXED), one kind only, or nothing."""
    if output.total_num_scheduled_tokens == 0:
        return Phase.EMPTY
    chunk = len(output.scheduled_new_reqs) + len(output.scheduled_cached_reqs.resumed_req_ids)
    if owner is not None and owner.request_id in output.num_scheduled_tokens:
        chunk += 1
    if not chunk:
        return Phase.DECODE
    return Phase.MIXED if len(output.num_scheduled_tokens) > chunk else Phase.PREFILL
