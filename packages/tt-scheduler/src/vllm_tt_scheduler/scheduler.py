"""``TTScheduler``: vLLM's scheduler, restricted to prefill-only, decode-only or empty steps.

Continuous batching stays vLLM's (admission, chunked prefill, preemption, grammars,
finishing); this layer only picks the phase of each step and lets vLLM's own
``schedule()`` run with the other phase's work hidden (see ``passes``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

from vllm.logger import init_logger
from vllm.v1.core.encoder_cache_manager import EncoderCacheManager, EncoderDecoderCacheManager
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus

from vllm_tt_scheduler import block_output, envs
from vllm_tt_scheduler.carry import carry_over
from vllm_tt_scheduler.compat import SchedulerBackports
from vllm_tt_scheduler.cost_policy import policy_for
from vllm_tt_scheduler.kv_fit import KVFit
from vllm_tt_scheduler.mixed import MixedShapes, mixed_pass, scheduled_phase
from vllm_tt_scheduler.options import SchedulerOptions
from vllm_tt_scheduler.passes import decode_pass, prefill_pass
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import WorkView
from vllm_tt_scheduler.queues import AdmissionPlanner, running_partials, size_reader
from vllm_tt_scheduler.requirements import check_vllm_config
from vllm_tt_scheduler.trace import NullStepTrace, QueueSnapshot, StepTrace, open_step_trace

logger = init_logger("vllm." + __name__)

_RUNNING = RequestStatus.RUNNING

# After a prefill pass admitted nothing, admission is retried once KV blocks were freed,
# or after this many steps at the latest.
_ADMISSION_RETRY_STEPS = 16


def encoder_frees_pending(manager: EncoderCacheManager) -> bool:
    """Whether vLLM's next ``get_freed_mm_hashes()`` hands entries over or moves them: the
    encoder cache's ``freed`` list, or for an encoder-decoder model (Mllama) its two-step
    buffer (``allocated`` this step, ``to_free`` the next), which has no ``freed``."""
    if isinstance(manager, EncoderDecoderCacheManager):
        return bool(manager.allocated or manager.to_free)
    return bool(manager.freed)


class PhaseScheduling(SchedulerBackports):
    """The phase policy on top of a vLLM scheduler class (see the two subclasses).

    ``schedule()`` is built from five public steps (``work_view``, ``run_pass``,
    ``fallback_phase``, ``admission_blocked``, ``end_step``), which the lane coordinator drives
    directly to run every lane in one phase chosen for all of them (skipping a lane that is
    ``idle_in`` that phase).
    """

    coordinated: ClassVar[bool] = False
    """A lane of ``TTLaneCoordinator``: the coordinator logs the policy and writes the step
    trace, once for all lanes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = SchedulerOptions.from_additional_config(self.vllm_config.additional_config)
        check_vllm_config(self.vllm_config, options, self.max_num_scheduled_tokens)
        self.tt_options = options
        self.phase_policy = policy_for(options)
        self.last_phase = Phase.EMPTY
        self._vllm_schedule = super().schedule  # bound once: a pass runs every step, per lane
        self._partials: list[Request] = []
        self._planner = AdmissionPlanner(fcfs=isinstance(self.waiting, deque))
        self._queue_size = size_reader(self.waiting)
        self._kv_fit = KVFit.for_scheduler(self)
        self._chunk = _chunk_tokens(self, options.prefill_chunk_cap)
        self._prefill_tokens = self.max_num_scheduled_tokens
        self._step_index = 0
        self._blocked_free_blocks: int | None = None
        self._blocked_until = 0
        if options.block_tokens > 1:
            block_output.reserve_lookahead(self, options.block_tokens)
        spec = self.vllm_config.speculative_config
        if spec is not None and spec.method == "custom_class":  # the model's own drafter writes its drafts' KV
            block_output.reserve_lookahead(self, 1 + spec.num_speculative_tokens)
        self._mixed = MixedShapes(options.mixed_shapes) if options.mixed_shapes else None
        self._trace: StepTrace = NullStepTrace()
        if not self.coordinated:
            self._trace = open_step_trace(envs.step_trace_path())
            logger.info("TT phase scheduler: %s, step trace=%s", self.policy_summary(),
                        envs.step_trace_path() or "off")

    def policy_summary(self) -> str:
        """The policy settings in force, for the startup log."""
        options = self.tt_options
        cap = options.prefill_chunk_cap or f"step budget ({self.max_num_scheduled_tokens})"
        if options.step_cost is None:
            policy = f"step-counted policy (no step cost model), prefill_hold={options.prefill_hold:g}"
        else:
            policy = f"cost-aware policy, step cost model: {options.step_cost.description}"
        mixed = f"mixed steps: {self._mixed.describe()}" if self._mixed is not None else "mixed steps off"
        if self._mixed is not None and options.itl_slo_ms:
            mixed += f", chunks sized to the ITL target {options.itl_slo_ms:g} ms"
        return f"{policy}, prefill_burst={options.prefill_burst}, prefill chunk cap={cap}, {mixed}"

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        view = self.work_view()
        chunk = self.mixed_chunk(view) if self._mixed is not None else None
        if chunk is not None:
            return self._mixed_step(view, chunk, throttle_prefills)
        plan = self.phase_policy.plan(view)
        if plan is Phase.PREFILL and view.prompts:
            self._prefill_tokens = self.phase_policy.prefill_tokens(view) or self._prefill_tokens
        output = self.run_pass(plan, throttle_prefills)
        retried = False
        if output.total_num_scheduled_tokens == 0:
            fallback = self.fallback_phase(plan)
            if fallback is not None:
                if plan is Phase.PREFILL and not (view.partials or view.must_scan):
                    self.admission_blocked()
                output = carry_over(output, self.run_pass(fallback, throttle_prefills, retry=True))
                plan, retried = fallback, True
        phase = plan if output.total_num_scheduled_tokens else Phase.EMPTY
        self.phase_policy.observe(phase, view)
        self.end_step(phase)
        self._trace.record(self._step_index - 1, phase, output, self, retried)
        return output

    def mixed_chunk(self, view: WorkView, decodes: int | None = None) -> int | None:
        """The chunk of a mixed step now, or None for a phase-pure one: decodes run, a prompt
        is ready (a partial prefill, or an admission that fits), a captured shape holds the
        decode rows, and the prompt wants no prompt logprobs (a mixed step returns the chunk's
        last logits only). ``decodes``: the step's decode rows (default: this scheduler's; the
        lane coordinator passes every lane's)."""
        decodes = view.decodes if decodes is None else decodes
        if self._mixed is None or not decodes or not (view.partials or view.admissible):
            return None
        partials = self._current_partials()
        prompt = partials[0] if partials else self._waiting_head()
        if prompt is None or (prompt.sampling_params is not None and prompt.sampling_params.prompt_logprobs):
            return None
        need = prompt.num_tokens - prompt.num_computed_tokens if partials else (view.prompts or (None,))[0]
        return self._mixed.chunk_for(decodes, need, self._within_itl_slo(decodes, prompt.num_computed_tokens))

    def _within_itl_slo(self, decodes: int, start: int) -> Callable[[int], bool] | None:
        """With an ITL target and a step cost model (the SLO-aware policy): whether a mixed step
        of ``decodes`` rows and a chunk after ``start`` prompt tokens stays within the target."""
        options = self.tt_options
        cost = options.step_cost
        if not options.itl_slo_ms or cost is None:
            return None
        context, slo_s = self._kv_tokens(), options.itl_slo_ms / 1e3
        return lambda chunk: cost.mixed_s(decodes, context, chunk, start) <= slo_s

    def _waiting_head(self) -> Request | None:
        """The request vLLM's admission loop looks at first."""
        for queue in (self.kv_holding_waiting, self.waiting):
            if self._queue_size(queue):
                return queue.peek_request()
        return None

    def run_mixed_pass(self, chunk: int, throttle_prefills: bool) -> tuple[SchedulerOutput, Phase]:
        """One mixed pass (``mixed.mixed_pass``): the decodes and one prompt's ``chunk``, and
        what it scheduled (MIXED; PREFILL when this scheduler has no decodes of its own)."""
        schedule = partial(self._vllm_schedule, True) if throttle_prefills else self._vllm_schedule
        partials = self._current_partials()
        output = mixed_pass(self, schedule, partials, chunk)
        self._partials = [request for request in self.running if request.is_prefill_chunk]
        return output, scheduled_phase(output, partials[0] if partials else None)

    def _mixed_step(self, view: WorkView, chunk: int, throttle_prefills: bool) -> SchedulerOutput:
        output, phase = self.run_mixed_pass(chunk, throttle_prefills)
        # A mixed step stalls no decode: for the policy it is a decode step.
        self.phase_policy.observe(Phase.DECODE if phase is Phase.MIXED else phase, view)
        self.end_step(phase)
        self._trace.record(self._step_index - 1, phase, output, self, False)
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> dict[int, EngineCoreOutputs]:
        if self.tt_options.block_tokens > 1:  # a decode row may have committed a block
            block_output.count_block_tokens(self.requests, scheduler_output, model_runner_output)
        return super().update_from_output(scheduler_output, model_runner_output)

    # -- the steps of schedule() --------------------------------------------------------------
    def work_view(self) -> WorkView:
        """This scheduler's work, for the phase decision; also sizes the token budget of its
        next prefill pass."""
        partials = self._current_partials() if self._partials else self._partials
        budget = self._prefill_tokens = self.max_num_scheduled_tokens
        size = self._queue_size
        if not partials and not (size(self.waiting) or size(self.kv_holding_waiting)):
            return WorkView(len(self.running), 0, 0)  # the common saturated decode step: nothing to plan
        slots = self._free_slots()
        if not partials and slots <= 0:
            return WorkView(len(self.running), 0, 0)  # full: nothing to admit
        decodes = len(self.running) - len(partials)
        pending = running_partials(partials, self._chunk)
        plan = self._planner.plan(self, slots, budget, self._chunk, pending)
        if plan.head is None or not self._admission_open(plan.head):
            return WorkView(decodes, pending.count, 0, must_scan=plan.must_scan)
        if plan.tokens:
            self._prefill_tokens = plan.tokens
        context = self._kv_tokens() if self.tt_options.step_cost is not None else 0
        return WorkView(decodes, pending.count, plan.admitted, plan.full, plan.must_scan, max(plan.steps, 1),
                        pending.tokens, plan.needs, context)

    def run_pass(self, plan: Phase, throttle_prefills: bool, retry: bool = False) -> SchedulerOutput:
        """One vLLM scheduling pass that sees only ``plan``'s work (EMPTY: a prefill pass).

        ``retry``: this pass replaces one whose output is discarded, in the same engine step.
        """
        if retry:
            self.current_step -= 1  # one engine step, however many passes it took
        schedule = partial(self._vllm_schedule, True) if throttle_prefills else self._vllm_schedule
        if plan is Phase.DECODE:
            return decode_pass(self, schedule, self._current_partials())
        # PREFILL, or EMPTY (nothing runs): nothing to hide beyond running decodes.
        output, self._partials = prefill_pass(
            self, schedule, self._current_partials(), self._prefill_tokens, self.tt_options.prefill_chunk_cap
        )
        return output

    def fallback_phase(self, plan: Phase) -> Phase | None:
        """The other phase, when a pass of ``plan`` scheduled nothing and the other might not."""
        if plan is Phase.DECODE:
            if self.waiting or self.kv_holding_waiting or self._current_partials():
                return Phase.PREFILL
            return None
        if any(not request.is_prefill_chunk for request in self.running):
            return Phase.DECODE
        return None

    def admission_blocked(self) -> None:
        """A prefill pass expected to admit admitted nothing (KV use is not always predictable):
        back off until KV blocks are freed or a few steps passed, so the following steps do not
        pay for the same failed pass."""
        self._blocked_free_blocks = self.kv_cache_manager.block_pool.get_num_free_blocks()
        self._blocked_until = self._step_index + _ADMISSION_RETRY_STEPS

    def idle_in(self, plan: Phase, view: WorkView) -> bool:
        """Whether a pass of ``plan`` would schedule nothing here and hand nothing over (no
        finished or preempted ids, no freed encoder entries), so that the lane coordinator can
        skip it; ``view`` is this step's ``work_view()``."""
        if plan is Phase.DECODE:
            if view.decodes:
                return False
        elif view.partials or view.must_scan or (
            (self.waiting or self.kv_holding_waiting) and self._free_slots() > 0
        ):
            return False
        return not (self.finished_req_ids or self.reset_preempted_req_ids or encoder_frees_pending(self.encoder_cache_manager))

    def end_step(self, phase: Phase) -> None:
        """Record the phase the step (or this lane's slice of it) ended up with."""
        if phase is Phase.PREFILL:
            self._blocked_free_blocks = None
        self.last_phase = phase
        self._step_index += 1

    def _current_partials(self) -> list[Request]:
        """The running partial prefills. Only prefill passes make them, so the list kept
        from the last one is filtered, instead of scanning all running requests."""
        partials = self._partials
        if partials:
            partials = [r for r in partials if r.status is _RUNNING and r.is_prefill_chunk]
            self._partials = partials
        return partials

    def _kv_tokens(self) -> int:
        """KV positions in use (blocks held x block size): what a decode step reads, closely
        enough for its modelled time, at the cost of one counter read."""
        pool = self.kv_cache_manager.block_pool
        return (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * self.block_size

    def _free_slots(self) -> int:
        """Requests that may still be admitted into running (vLLM stops admitting at 0)."""
        return (
            min(self.max_num_active_reqs, self.max_num_running_reqs)
            - len(self.running)
            - self.num_waiting_for_streaming_input
        )

    def _admission_open(self, head: Any) -> bool:
        if self._blocked_free_blocks is not None:
            free = self.kv_cache_manager.block_pool.get_num_free_blocks()
            if free <= self._blocked_free_blocks and self._step_index < self._blocked_until:
                return False
            self._blocked_free_blocks = None
        return self._kv_fit.fits(self, head, self._chunk)

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
