"""Steer vLLM's ``schedule()`` into one phase by controlling what it sees.

vLLM's scheduler is token-budget based and mixes prefill and decode freely. Rather than
fork its thousand-line ``schedule()``, each pass hides the other phase's work for one
call and puts everything back afterwards, including whatever the call changed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from vllm.v1.core.sched.request_queue import RequestQueue, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler


@contextmanager
def prefill_only(sched: Scheduler, step_tokens: int, chunk_cap: int | None) -> Iterator[None]:
    """Hide running decodes, so only waiting requests and partial prefills are seen.

    The slot limits drop by the number hidden, or vLLM would admit past the real
    capacity (and trip its own running-count assertion). The step's token budget
    becomes ``step_tokens`` (see ``queues.plan_admissions``). vLLM drops its
    per-request chunk limit when it sees a single eligible request; ``chunk_cap`` then
    bounds the step budget, so no chunk outgrows the model's largest prefill trace.
    """
    running = sched.running
    decodes = [request for request in running if not request.is_prefill_chunk]
    hidden = len(decodes)
    if hidden:
        sched.running = [request for request in running if request.is_prefill_chunk]
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
        yield
    finally:
        sched.max_num_scheduled_tokens = step_budget
        if hidden:
            sched.max_num_running_reqs += hidden
            sched.max_num_active_reqs += hidden
            sched.running = decodes + sched.running


class DecodeOnly:
    """Hides the waiting queues and partial prefills, so only decodes are seen.

    The waiting queues are swapped for empty ones. vLLM prepends requests it preempts
    during the call to those (temporary) queues; they are moved back to the front of
    the real queues in the same order, or they would be lost. Empty spare queues are
    reused across steps.
    """

    def __init__(self, sched: Scheduler) -> None:
        self._sched = sched
        self._spare_waiting = create_request_queue(sched.policy)
        self._spare_holding = create_request_queue(sched.policy)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        sched = self._sched
        waiting, holding = sched.waiting, sched.kv_holding_waiting
        running = sched.running
        partials = [request for request in running if request.is_prefill_chunk]
        if partials:
            sched.running = [request for request in running if not request.is_prefill_chunk]
        sched.waiting, sched.kv_holding_waiting = self._spare_waiting, self._spare_holding
        try:
            yield
        finally:
            temp_waiting, temp_holding = sched.waiting, sched.kv_holding_waiting
            sched.waiting, sched.kv_holding_waiting = waiting, holding
            self._spare_waiting = _drain_to_front(temp_waiting, waiting, sched)
            self._spare_holding = _drain_to_front(temp_holding, holding, sched)
            if partials:
                sched.running.extend(partials)


def _drain_to_front(temp: RequestQueue, real: RequestQueue, sched: Scheduler) -> RequestQueue:
    """Move requests preempted into ``temp`` to the front of ``real``; return an empty
    queue to reuse."""
    if not temp:
        return temp
    # ``temp`` holds the latest preemption first; prepending in reverse keeps that order.
    for request in reversed(list(temp)):
        real.prepend_request(request)
    return create_request_queue(sched.policy)
