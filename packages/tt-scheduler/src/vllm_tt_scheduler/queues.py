"""Cheap reads of vLLM's queues that the phase decision is made from.

Deciding from queue state up front costs a few attribute reads per step; the obvious
alternative (always try a prefill pass, fall back to decode) runs vLLM's whole
scheduling loop twice on every saturated step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain
from typing import NamedTuple

from vllm.utils.math_utils import cdiv
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.request_queue import RequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED
_GRAMMAR = RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
_REMOTE_KVS = RequestStatus.WAITING_FOR_REMOTE_KVS
_STREAMING = RequestStatus.WAITING_FOR_STREAMING_REQ

_deque_len = deque.__len__


def size_reader(queue: RequestQueue) -> Callable[[RequestQueue], int]:
    """The cheapest ``len`` for queues of ``queue``'s class. vLLM's FCFS queue is a deque
    whose ``__len__`` and ``__bool__`` are Python overrides (two frames per truth test), and
    the phase decision reads queue sizes on every step, per lane."""
    if isinstance(queue, deque):
        return _deque_len  # type: ignore[return-value]
    return len


class AdmissionPlan(NamedTuple):
    """What a prefill pass would do now, walking the waiting queues in order (a tuple: one
    is built on most steps while prompts wait; a frozen dataclass costs four times as much)."""

    admitted: int
    """Requests the pass would admit."""
    tokens: int
    """Prefill tokens of the step: running partial chunks plus those admissions."""
    steps: int
    """Prefill steps the partials and admissions need in all (chunks of the longest)."""
    head: Request | None
    """The first ready request: vLLM stops admitting at the first one that does not fit."""
    full: bool
    """The token budget is the limit: the next ready request does not fit this step,
    so waiting longer could not make the step admit more."""
    must_scan: bool
    """A request needs vLLM's scan to change state (a failed grammar to report)."""
    settled: bool = True
    """Only plain waiting requests were seen: the plan holds while the queue does."""
    needs: tuple[int, ...] = ()
    """Prefill tokens of each admission this step, in queue order (the cost-aware policy may
    admit only the first few)."""


@dataclass(frozen=True)
class Partials:
    """Running requests in the middle of a chunked prefill."""

    count: int
    tokens: int
    """Tokens vLLM gives them in the next prefill pass."""
    steps: int
    """Prefill steps until the last of them is done."""


_NO_PARTIALS = Partials(0, 0, 0)


def running_partials(partials: list[Request], chunk: int) -> Partials:
    """What the running partial prefills still need."""
    if not partials:
        return _NO_PARTIALS
    tokens = steps = 0
    for request in partials:
        left = request.num_tokens - request.num_computed_tokens
        tokens += min(left, chunk)
        steps = max(steps, cdiv(left, chunk))
    return Partials(len(partials), tokens, steps)


def plan_admissions(
    sched: Scheduler, slots: int, budget: int, chunk: int, partials: Partials
) -> AdmissionPlan:
    """Plan admissions into the token budget left after the running partials.

    vLLM fills a step's budget greedily and chunks the last prompt that does not fit;
    for a phase scheduler that chunk costs a whole extra prefill step (decodes stalled
    again), so the plan stops before it. A prompt longer than ``chunk`` (the step
    budget, or the model's largest prefill trace) is split anyway: it may start in
    the budget left over if that costs it no extra chunk, and while partials are in
    flight only if it is done when they are (so admissions never stretch a chain of
    prefill steps). The planned tokens become the pass's budget.

    Ready mirrors vLLM's own skip rules: a grammar still compiling, a remote KV load in
    flight, a streaming session waiting for input, or undelivered stale output after a
    preemption keep a request out of this step without blocking those behind it.
    """
    tokens, steps = partials.tokens, partials.steps
    if slots <= 0:
        return AdmissionPlan(0, tokens, steps, None, False, False)
    queues: tuple[RequestQueue, ...]
    if sched.pause_state is PauseState.UNPAUSED:
        queues = (sched.kv_holding_waiting, sched.waiting)
    elif sched.pause_state is PauseState.PAUSED_NEW:
        queues = (sched.kv_holding_waiting,)
    else:
        return AdmissionPlan(0, tokens, steps, None, False, False)
    count = 0
    needs: list[int] = []
    head: Request | None = None
    full = must_scan = False
    settled = not sched.kv_holding_waiting
    for request in chain(*queues):
        status = request.status
        if status is not _WAITING and status is not _PREEMPTED:
            settled = False  # readiness can change without the queue changing
            if status is _GRAMMAR:
                grammar_state = _grammar_state(sched, request)
                if grammar_state == "failed":
                    must_scan = True
                if grammar_state != "ready":
                    continue
            elif status is _REMOTE_KVS:
                if request.request_id not in sched.finished_recving_kv_req_ids:
                    continue
            elif status is _STREAMING:
                continue
        if request.num_stale_output_tokens and not request.drop_stale_output:
            settled = False
            continue
        if head is None:
            head = request
        if count >= slots:
            break
        need = request.num_tokens - request.num_computed_tokens
        if need <= chunk:  # the common case: the whole prompt, or nothing this step
            if tokens + need > budget:
                full = True
                break
            tokens += need
            steps = steps or 1
            count += 1
            needs.append(need)
            continue
        need_steps = cdiv(need, chunk)
        first = min(chunk, budget - tokens)
        if (
            first <= 0
            or cdiv(need - first, chunk) >= need_steps  # starting now costs a chunk
            or (partials.steps and need_steps > partials.steps)
        ):
            full = True
            break
        tokens += first
        steps = max(steps, need_steps)
        count += 1
        needs.append(first)
    return AdmissionPlan(count, tokens, steps, head, full, must_scan, settled, tuple(needs))


class AdmissionPlanner:
    """``plan_admissions`` with a one-entry memo.

    While new prompts are held back, the same queue is planned step after step; the
    plan is reused as long as the slots, the budget and the queue (its length and the
    requests at both ends) are unchanged, there are no partial prefills, and the last
    scan met no request whose readiness can change in place (a grammar compiling, stale
    output, ...). Both ends, because an abort inside the queue plus an arrival keeps its
    length and head. Only FCFS queues are memoized: their ends pin down their contents
    (vLLM only appends, prepends, pops the head and removes aborted requests).
    """

    def __init__(self, fcfs: bool) -> None:
        self._fcfs = fcfs
        self._key: tuple[object, ...] | None = None
        self._plan: AdmissionPlan | None = None

    def plan(
        self, sched: Scheduler, slots: int, budget: int, chunk: int, partials: Partials
    ) -> AdmissionPlan:
        key = None
        if self._fcfs and not partials.count:
            waiting: deque[Request] = sched.waiting  # type: ignore[assignment]
            size = _deque_len(waiting)
            ends = (waiting[0], waiting[-1]) if size else None
            key = (slots, budget, size, ends, sched.pause_state)
            if key == self._key and self._plan is not None:
                return self._plan
        plan = plan_admissions(sched, slots, budget, chunk, partials)
        self._key = key if plan.settled else None
        self._plan = plan
        return plan


def _grammar_state(sched: Scheduler, request: Request) -> str:
    structured = request.structured_output_request
    grammar = structured.grammar if structured is not None else None
    if grammar is None:
        return "compiling"
    if isinstance(grammar, Exception):
        # Reported once by vLLM's scan, then finished in update_from_output.
        return "reported" if request.request_id in sched.grammar_compile_error_reqs else "failed"
    return "ready"
