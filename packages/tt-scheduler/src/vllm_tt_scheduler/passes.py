"""Steer vLLM's ``schedule()`` into one phase by controlling what it sees.

vLLM's scheduler is token-budget based and mixes prefill and decode freely. Rather than
fork its thousand-line ``schedule()``, each pass hides the other phase's work for one
call and puts everything back afterwards, including whatever the call changed. (Plain
try/finally rather than context managers: this runs on every engine step.)
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.request_queue import RequestQueue, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

from vllm_tt_scheduler.queues import size_reader

Schedule = Callable[[], SchedulerOutput]


def prefill_pass(
    sched: Scheduler,
    schedule: Schedule,
    partials: list[Request],
    step_tokens: int,
    chunk_cap: int | None,
) -> tuple[SchedulerOutput, list[Request]]:
    """Run ``schedule`` with running decodes hidden: only waiting requests and the
    running ``partials`` (prefills in progress) are seen. Returns the output and the
    partial prefills after the pass.

    The slot limits drop by the number hidden, or vLLM would admit past the real
    capacity (and trip its own running-count assertion). The step's token budget
    becomes ``step_tokens`` (see ``queues.plan_admissions``). vLLM drops its
    per-request chunk limit when it sees a single eligible request; ``chunk_cap`` then
    bounds the step budget, so no chunk outgrows the model's largest prefill trace.
    """
    decodes = sched.running
    if partials:
        shown = set(partials)
        decodes = [request for request in decodes if request not in shown]
    hidden = len(decodes)
    sched.running = list(partials)
    sched.max_num_running_reqs -= hidden
    sched.max_num_active_reqs -= hidden
    step_budget = sched.max_num_scheduled_tokens
    tokens = min(step_tokens, step_budget)
    if chunk_cap is not None and chunk_cap < tokens:
        num_running, num_waiting = sched.get_request_counts()
        if num_running + num_waiting <= 1:
            tokens = chunk_cap
    sched.max_num_scheduled_tokens = tokens
    try:
        output = schedule()
        # Only requests this pass could see can be partial prefills now.
        partials = [request for request in sched.running if request.is_prefill_chunk]
        return output, partials
    finally:
        sched.max_num_scheduled_tokens = step_budget
        sched.max_num_running_reqs += hidden
        sched.max_num_active_reqs += hidden
        decodes.extend(sched.running)
        sched.running = decodes
        if hidden:
            _still_on_runner(sched, decodes[:hidden])


def _still_on_runner(sched: Scheduler, hidden: list[Request]) -> None:
    """Count hidden requests as scheduled in the previous step.

    vLLM resends a request's whole token list when it was not scheduled in the previous
    step (its GPU runner drops such requests from its batch). A TT runner keeps every
    running request across steps, so after each prefill step the decodes it stalled
    would otherwise be resent in full: a copy of every running sequence, for nothing.
    """
    if not sched.use_v2_model_runner:
        sched.prev_step_scheduled_req_ids.update(request.request_id for request in hidden)


class DecodePass:
    """Runs a pass with the waiting queues and partial prefills hidden: only decodes
    are seen.

    The waiting queues are swapped for empty ones. vLLM prepends requests it preempts
    during the call to those (temporary) queues; they are moved back to the front of
    the real queues in the same order, or they would be lost. Empty spare queues are
    reused across steps.
    """

    def __init__(self, sched: Scheduler) -> None:
        self._sched = sched
        self._spare_waiting = create_request_queue(sched.policy)
        self._spare_holding = create_request_queue(sched.policy)
        self._size = size_reader(sched.waiting)

    def __call__(self, schedule: Schedule, partials: list[Request]) -> SchedulerOutput:
        """``partials``: the running partial prefills (to hide)."""
        sched = self._sched
        waiting, holding = sched.waiting, sched.kv_holding_waiting
        if not partials and (not (self._size(waiting) or self._size(holding)) or _no_free_slot(sched)):
            # Nothing to hide: vLLM's admission loop stops at once when no slot is free (and
            # is skipped when it preempts), and a request it preempts goes to the front of
            # the real waiting queue, where it would be moved to anyway.
            return schedule()
        if partials:
            hidden = set(partials)
            sched.running = [request for request in sched.running if request not in hidden]
        sched.waiting, sched.kv_holding_waiting = self._spare_waiting, self._spare_holding
        preempted: set[str] | None = {"?"}  # unknown until the pass returns
        try:
            output = schedule()
            preempted = output.preempted_req_ids
            return output
        finally:
            temp_waiting, temp_holding = sched.waiting, sched.kv_holding_waiting
            sched.waiting, sched.kv_holding_waiting = waiting, holding
            if preempted:  # only preemption puts requests into the swapped-in queues
                self._spare_waiting = _drain_to_front(temp_waiting, waiting, sched)
                self._spare_holding = _drain_to_front(temp_holding, holding, sched)
            if partials:
                sched.running.extend(partials)
                _still_on_runner(sched, partials)


def _no_free_slot(sched: Scheduler) -> bool:
    running = len(sched.running) + sched.num_waiting_for_streaming_input
    return running >= sched.max_num_active_reqs or running >= sched.max_num_running_reqs


def _drain_to_front(temp: RequestQueue, real: RequestQueue, sched: Scheduler) -> RequestQueue:
    """Move requests preempted into ``temp`` to the front of ``real``; return an empty
    queue to reuse."""
    if not temp:
        return temp
    # ``temp`` holds the latest preemption first; prepending in reverse keeps that order.
    for request in reversed(list(temp)):
        real.prepend_request(request)
    return create_request_queue(sched.policy)
