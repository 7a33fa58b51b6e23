"""The cost-aware phase policy: prefill versus decode, and how many prompts share a prefill
step, decided by modelled device time (``cost.StepCostModel``) instead of step counts.

Why it needs no hold knob: a prefill step takes the longer of streaming the weights and its
prompts' compute, so once the compute exceeds the stream, prompts prefilled one step each cost
the running decodes exactly the time they would cost batched, while each of them gets its first
token sooner. Waiting to batch only pays while a step would be stream-bound (short prompts),
and then only for as long as the waiting prompts' accrued wait stays below what the step would
make the running decodes wait beyond its prompts' own compute.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_tt_scheduler.cost import StepCostModel
from vllm_tt_scheduler.options import SchedulerOptions
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import PhasePolicy, WorkView


@dataclass
class CostAwarePolicy:
    """Prefill-first with the ``prefill_burst`` decode-stall bound kept as a hard limit.

    Rules, in order: nothing runs -> prefill if there is prefill work, else empty; no prefill
    work -> decode; ``prefill_burst`` prefill steps in a row -> decode; chunks in flight, a
    pending scan or a full step -> prefill. Otherwise prefill, unless the step would be
    stream-bound and the admissible prompts have waited less (in request-seconds) than the
    stream time it would leave unused times the decodes it stalls (``padding_s``).
    ``prefill_tokens`` then admits, in queue order, each prompt whose compute delays the
    prompts already in the step by less than it would itself wait for a step of its own.
    """

    cost: StepCostModel
    prefill_burst: int
    burst: int = 0
    """Prefill steps in a row that stalled running decodes."""
    debt_s: float = 0.0
    """Request-seconds the admissible prompts have waited since the last prefill step."""

    def plan(self, view: WorkView) -> Phase:
        """The phase to try for the next step."""
        wants_prefill = view.partials or view.admissible or view.must_scan
        if not view.decodes:
            return Phase.PREFILL if wants_prefill else Phase.EMPTY
        if not wants_prefill or self.burst >= self.prefill_burst:
            return Phase.DECODE
        return Phase.PREFILL

    def padding_s(self, view: WorkView) -> float:
        """Seconds of the prefill step over ``view``'s admissions in which the weights stream
        for no prompt compute: what batching more prompts into it would recover."""
        tokens, rows = sum(view.prompts), len(view.prompts)
        if not rows:
            return 0.0
        return max(0.0, self.cost.prefill_s(tokens, rows) - self.cost.prefill_compute_s(tokens, rows))

    def prefill_tokens(self, view: WorkView) -> int | None:
        """Token budget of the prefill pass: the partial chunks plus the first admissions that
        are worth sharing the step (see the class docstring); None when all are."""
        prompts = view.prompts
        if len(prompts) + view.partials <= 1:
            return None
        cost = self.cost
        tokens, rows = view.partial_tokens, view.partials
        step_s = cost.prefill_s(tokens, rows)
        # A prompt left out waits for a step of its own, after a decode step when this step
        # exhausts the burst bound (a prefill step with nothing running stalls nobody).
        decode_wait = 0.0
        if view.decodes and self.burst + 1 >= self.prefill_burst:
            decode_wait = cost.decode_s(view.decodes, view.context)
        for need in prompts:
            with_it = cost.prefill_s(tokens + need, rows + 1)
            added = with_it - step_s
            alone = cost.prefill_s(need, 1)
            if rows and rows * added > alone - added + decode_wait:
                return tokens
            tokens, rows, step_s = tokens + need, rows + 1, with_it
        return None

    def observe(self, phase: Phase, view: WorkView) -> None:
        """Account for the step that was actually scheduled."""
        if phase is Phase.PREFILL:
            self.debt_s = 0.0
            self.burst = self.burst + 1 if view.decodes else 0
        elif phase is Phase.DECODE:
            self.burst = 0
            if view.admissible:
                self.debt_s += view.admissible * self.cost.decode_s(view.decodes, view.context)


def policy_for(options: SchedulerOptions) -> PhasePolicy | CostAwarePolicy:
    """The cost-aware policy when the scheduler was handed a step cost model, else the
    step-counted one."""
    if options.step_cost is not None:
        return CostAwarePolicy(options.step_cost, options.prefill_burst)
    return PhasePolicy(options.prefill_burst, hold_ratio=options.prefill_hold)
