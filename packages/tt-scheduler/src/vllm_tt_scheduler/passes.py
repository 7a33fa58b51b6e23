"""Steer vLLM's ``schedule()`` into one phase by controlling what it sees.

vLLM's scheduler is token-budget based and mixes prefill and decode freely. Rather than
fork its thousand-line ``schedule()``, each pass hides the other phase's work for one
call and puts everything back afterwards, including whatever the call changed. (Plain
try/finally rather than context managers: this runs on every engine step.)
"""

from __future__ import annotations

from collections.abc import Callable

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request

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
            still_on_runner(sched, decodes[:hidden])


def still_on_runner(sched: Scheduler, hidden: list[Request]) -> None:
    """Count hidden requests as scheduled in the previous step.

    vLLM resends a request's whole token list when it was not scheduled in the previous
    step (its GPU runner drops such requests from its batch). A TT runner keeps every
    running request across steps, so after each prefill step the decodes it stalled
    would otherwise be resent in full: a copy of every running sequence, for nothing.
    """
    if not sched.use_v2_model_runner:
        sched.prev_step_scheduled_req_ids.update(request.request_id for request in hidden)


def decode_pass(sched: Scheduler, schedule: Schedule, partials: list[Request]) -> SchedulerOutput:
    """Run ``schedule`` seeing only decodes: admission closed and the running ``partials``
    (prefills in progress) hidden.

    Admission is closed by vLLM's own limit: its loop over the waiting queues stops first
    thing when the active requests reach ``max_num_active_reqs``, which is zero for the call
    (``tests/test_compat.py`` pins that). The waiting queues stay in place, so a request vLLM
    preempts during the call goes to the front of the real queue, as it would anyway.
    """
    active = sched.max_num_active_reqs
    sched.max_num_active_reqs = 0
    if partials:
        hidden = set(partials)
        sched.running = [request for request in sched.running if request not in hidden]
    try:
        return schedule()
    finally:
        sched.max_num_active_reqs = active
        if partials:
            sched.running.extend(partials)
            still_on_runner(sched, partials)
