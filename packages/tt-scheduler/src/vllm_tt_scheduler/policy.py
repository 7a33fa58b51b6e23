"""Which phase the next step should be: a pure decision over a small view of the queues.

Kept apart from the vLLM wrapper so the rules read (and are tested) as a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from vllm_tt_scheduler.phase import Phase


class WorkView(NamedTuple):
    """The queue facts the decision needs, gathered in one cheap pass (a tuple: one is
    built on every engine step)."""

    decodes: int
    """Running requests past their prefill (each wants one decode token)."""
    partials: int
    """Running requests in the middle of a chunked prefill."""
    admissible: int
    """Waiting requests a prefill pass could admit now (slot free, ready, KV fits)."""
    full: bool = False
    """The admissions fill this step's token budget: waiting cannot add to them."""
    must_scan: bool = False
    """A waiting request needs vLLM's admission scan even if nothing gets admitted
    (e.g. its grammar failed to compile and must be finished as an error)."""
    steps: int = 1
    """Prefill steps those admissions take (more than one when prompts are chunked)."""
    partial_tokens: int = 0
    """Tokens the running partial prefills get in the next prefill step."""
    prompts: tuple[int, ...] = ()
    """Prefill tokens of each admission, in queue order (``AdmissionPlan.needs``)."""
    context: int = 0
    """KV positions the running decodes read (filled only for the cost-aware policy)."""



def bounded_phase(view: WorkView, burst: int, prefill_burst: int) -> Phase | None:
    """What prefill-first with a bounded decode stall forces, None where a policy chooses:
    nothing runs -> prefill if there is prefill work, else empty; no prefill work, or
    ``prefill_burst`` prefill steps in a row have stalled the decodes -> decode."""
    wants_prefill = view.partials or view.admissible or view.must_scan
    if not view.decodes:
        return Phase.PREFILL if wants_prefill else Phase.EMPTY
    if not wants_prefill or burst >= prefill_burst:
        return Phase.DECODE
    return None


def next_burst(phase: Phase, view: WorkView, burst: int) -> int:
    """The stall count after a step of ``phase``: prefill steps in a row with decodes running."""
    if phase is Phase.PREFILL:
        return burst + 1 if view.decodes else 0
    return 0 if phase is Phase.DECODE else burst

@dataclass
class PhasePolicy:
    """Prefill-first with a bounded decode stall, plus an admission hold.

    Rules, in order: nothing runs -> prefill if there is prefill work, else empty;
    no prefill work -> decode; ``prefill_burst`` prefill steps in a row have stalled
    the decodes -> decode; chunks in flight, a pending scan, or admissions that fill
    the step's token budget -> prefill. Other admissions are held back while the
    wait they have accrued (request-steps) is below ``hold_ratio`` x the decode
    steps their prefill would stall (decodes x prefill steps): admitting one request
    per freed slot would otherwise cost a whole decode step per request.
    ``hold_ratio=0`` admits at once.
    """

    prefill_burst: int
    hold_ratio: float = 0.0
    burst: int = 0
    """Prefill steps in a row that stalled running decodes."""
    debt: int = 0
    """Request-steps that admissible work has waited since the last prefill step."""

    def plan(self, view: WorkView) -> Phase:
        """The phase to try for the next step."""
        forced = bounded_phase(view, self.burst, self.prefill_burst)
        if forced is not None:
            return forced
        if view.partials or view.must_scan or view.full:
            return Phase.PREFILL
        if self.debt + view.admissible >= view.decodes * view.steps * self.hold_ratio:
            return Phase.PREFILL
        return Phase.DECODE

    def prefill_tokens(self, view: WorkView) -> int | None:
        """The token budget of the prefill pass; None: the admission plan's (all it admits)."""
        return None

    def observe(self, phase: Phase, view: WorkView) -> None:
        """Account for the step that was actually scheduled."""
        self.burst = next_burst(phase, view, self.burst)
        if phase is Phase.PREFILL:
            self.debt = 0
        elif phase is Phase.DECODE:
            self.debt += view.admissible
