"""The cost-aware phase policy: prefill versus decode, and how many prompts share a prefill
step, decided by modelled device time (``cost.StepCostModel``) instead of step counts.

Why it needs no hold knob: a prefill step takes the longer of streaming the weights and its
prompts' compute, so once the compute exceeds the stream, prompts prefilled one step each stall
the running decodes exactly as long as batched, while each gets its first token sooner; holding
prompts back to batch them only delays them. Only a stream-bound step (short prompts) has time
to give away, and prompts that fit in it share it (``prefill_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_tt_scheduler.cost import StepCostModel
from vllm_tt_scheduler.options import SchedulerOptions
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import PhasePolicy, WorkView, bounded_phase, next_burst


@dataclass
class CostAwarePolicy:
    """Prefill-first with the ``prefill_burst`` decode-stall bound kept as a hard limit.

    Rules, in order: nothing runs -> prefill if there is prefill work, else empty; no prefill
    work -> decode; ``prefill_burst`` prefill steps in a row -> decode; otherwise prefill (no
    hold). ``prefill_tokens`` then admits, in queue order, each prompt whose compute delays the
    prompts already in the step by less than it would itself wait for a step of its own.
    """

    cost: StepCostModel
    prefill_burst: int
    burst: int = 0
    """Prefill steps in a row that stalled running decodes."""

    def plan(self, view: WorkView) -> Phase:
        """The phase to try for the next step."""
        forced = bounded_phase(view, self.burst, self.prefill_burst)
        return Phase.PREFILL if forced is None else forced

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
        self.burst = next_burst(phase, view, self.burst)


def policy_for(options: SchedulerOptions) -> PhasePolicy | CostAwarePolicy:
    """The cost-aware policy when the scheduler was handed a step cost model, else the
    step-counted one."""
    if options.step_cost is not None:
        return CostAwarePolicy(options.step_cost, options.prefill_burst)
    return PhasePolicy(options.prefill_burst, hold_ratio=options.prefill_hold)
