"""``TTScheduler``: vLLM's scheduler, restricted to prefill-only, decode-only or empty steps.

Continuous batching stays vLLM's (admission, chunked prefill, preemption, grammars,
finishing); this layer only picks the phase of each step and lets vLLM's own
``schedule()`` run with the other phase's work hidden (see ``passes``).
"""

from __future__ import annotations

from typing import Any

from vllm.logger import init_logger
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler

from vllm_tt_scheduler import envs
from vllm_tt_scheduler.carry import carry_over
from vllm_tt_scheduler.kv_fit import KVFit
from vllm_tt_scheduler.options import SchedulerOptions
from vllm_tt_scheduler.passes import DecodeOnly, prefill_only
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import PhasePolicy, WorkView
from vllm_tt_scheduler.queues import free_slots, plan_admissions, running_partials
from vllm_tt_scheduler.requirements import check_vllm_config
from vllm_tt_scheduler.trace import QueueSnapshot, open_step_trace

logger = init_logger("vllm." + __name__)

# After a prefill pass admitted nothing, admission is retried once KV blocks were freed,
# or after this many steps at the latest.
_ADMISSION_RETRY_STEPS = 16


class PhaseScheduling(Scheduler):
    """The phase policy on top of a vLLM scheduler class (see the two subclasses)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = SchedulerOptions.from_additional_config(self.vllm_config.additional_config)
        check_vllm_config(self.vllm_config, options, self.max_num_scheduled_tokens)
        self.tt_options = options
        self.phase_policy = PhasePolicy(options.prefill_burst, hold_ratio=options.prefill_hold)
        self.last_phase = Phase.EMPTY
        self._decode_only = DecodeOnly(self)
        self._kv_fit = KVFit.for_scheduler(self)
        self._chunk = _chunk_tokens(self, options.prefill_chunk_cap)
        self._prefill_tokens = self.max_num_scheduled_tokens
        self._step_index = 0
        self._blocked_free_blocks: int | None = None
        self._blocked_until = 0
        self._trace = open_step_trace(envs.step_trace_path())
        logger.info(
            "TT phase scheduler: prefill_burst=%d, prefill_hold=%g, prefill chunk cap=%s, step trace=%s",
            options.prefill_burst,
            options.prefill_hold,
            options.prefill_chunk_cap or f"step budget ({self.max_num_scheduled_tokens})",
            envs.step_trace_path() or "off",
        )

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        view = self._work_view()
        plan = self.phase_policy.plan(view)
        output = self._run_pass(plan, throttle_prefills)
        retried = False
        if output.total_num_scheduled_tokens == 0:
            fallback = self._fallback(plan)
            if fallback is not None:
                if plan is Phase.PREFILL and not (view.partials or view.must_scan):
                    self._remember_blocked_admission()
                self.current_step -= 1  # one engine step, however many passes it took
                output = carry_over(output, self._run_pass(fallback, throttle_prefills))
                plan, retried = fallback, True
        phase = plan if output.total_num_scheduled_tokens else Phase.EMPTY
        if phase is Phase.PREFILL:
            self._blocked_free_blocks = None
        self.phase_policy.observe(phase, view)
        self.last_phase = phase
        self._trace.record(self._step_index, phase, output, self, retried)
        self._step_index += 1
        return output

    def _run_pass(self, plan: Phase, throttle_prefills: bool) -> SchedulerOutput:
        if plan is Phase.DECODE:
            with self._decode_only():
                return super().schedule(throttle_prefills)
        # PREFILL, or EMPTY (nothing runs): nothing to hide beyond running decodes.
        with prefill_only(self, self._prefill_tokens, self.tt_options.prefill_chunk_cap):
            return super().schedule(throttle_prefills)

    def _fallback(self, plan: Phase) -> Phase | None:
        """The other phase, when a pass scheduled nothing and the other might not."""
        if plan is Phase.DECODE:
            if (
                self.waiting
                or self.kv_holding_waiting
                or any(request.is_prefill_chunk for request in self.running)
            ):
                return Phase.PREFILL
            return None
        if any(not request.is_prefill_chunk for request in self.running):
            return Phase.DECODE
        return None

    def _work_view(self) -> WorkView:
        partials = running_partials(self, self._chunk)
        decodes = len(self.running) - partials.count
        budget = self.max_num_scheduled_tokens
        self._prefill_tokens = budget
        if not (self.waiting or self.kv_holding_waiting):
            return WorkView(decodes, partials.count, 0)
        plan = plan_admissions(self, free_slots(self), budget, self._chunk, partials)
        if plan.head is None or not self._admission_open(plan.head):
            return WorkView(decodes, partials.count, 0, must_scan=plan.must_scan)
        if plan.tokens:
            self._prefill_tokens = plan.tokens
        return WorkView(decodes, partials.count, plan.count, plan.full, plan.must_scan, max(plan.steps, 1))

    def _admission_open(self, head: Any) -> bool:
        if self._blocked_free_blocks is not None:
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            if free <= self._blocked_free_blocks and self._step_index < self._blocked_until:
                return False
            self._blocked_free_blocks = None
        return self._kv_fit.fits(self, head, self._chunk)

    def _remember_blocked_admission(self) -> None:
        self._blocked_free_blocks = self.kv_cache_manager.block_pool.get_num_free_blocks()
        self._blocked_until = self._step_index + _ADMISSION_RETRY_STEPS

    def snapshot(self) -> QueueSnapshot:
        """Queue sizes and KV use, for the step trace."""
        pool = self.kv_cache_manager.block_pool
        total = pool.num_gpu_blocks - 1  # block 0 is vLLM's null block
        num_running, num_waiting = self.get_request_counts()
        return QueueSnapshot(num_waiting, num_running, total - pool.get_num_free_blocks(), total)

    def shutdown(self) -> None:
        self._trace.close()
        super().shutdown()


def _chunk_tokens(sched: Scheduler, cap: int | None) -> int:
    """Largest prefill chunk vLLM gives one request in a step."""
    chunk = sched.max_num_scheduled_tokens
    threshold = sched.scheduler_config.long_prefill_token_threshold
    for limit in (cap, threshold):
        if limit:
            chunk = min(chunk, limit)
    return chunk


class TTScheduler(PhaseScheduling):
    """Phase scheduler for synchronous scheduling (``scheduler_cls``)."""


class TTAsyncScheduler(PhaseScheduling, AsyncScheduler):
    """Phase scheduler on top of vLLM's ``AsyncScheduler`` (async scheduling on)."""
