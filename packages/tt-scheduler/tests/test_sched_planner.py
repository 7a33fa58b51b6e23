"""The admission planner carries its plan across steps; it must always equal a fresh plan.

Random edits of a waiting queue, in the ways vLLM changes it between two steps (arrivals at
the tail, admissions and preemptions at the head, aborts anywhere), and of the slots and the
step budget; after each edit the carried plan is compared with ``plan_admissions`` run afresh.
"""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm_tt_scheduler.queues import AdmissionPlanner, Partials, plan_admissions
from vllm_tt_testing.scheduler_sim import make_request

NO_PARTIALS = Partials(0, 0, 0)
CHUNK = 256

edits = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.integers(1, 600)),
        st.tuples(st.just("admit"), st.integers(1, 3)),
        st.tuples(st.just("preempt"), st.integers(1, 600)),
        st.tuples(st.just("abort"), st.integers(0, 40)),
        st.tuples(st.just("slots"), st.integers(-1, 8)),
        st.tuples(st.just("budget"), st.sampled_from([256, 512, 2048])),
        st.tuples(st.just("abort_and_arrive"), st.integers(0, 40)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(edits)
def test_carried_plan_equals_a_fresh_plan(steps: list[tuple[str, int]]) -> None:
    sched = SimpleNamespace(
        waiting=FCFSRequestQueue(),
        kv_holding_waiting=FCFSRequestQueue(),
        pause_state=PauseState.UNPAUSED,
        finished_recving_kv_req_ids=set(),
        grammar_compile_error_reqs=set(),
    )
    planner = AdmissionPlanner(fcfs=True)
    slots, budget, made = 4, 2048, 0

    def new_request(prompt_len: int) -> object:
        nonlocal made
        made += 1
        return make_request(f"r{made}", prompt_len, 8)

    for kind, value in steps:
        waiting = sched.waiting
        if kind == "arrive":
            waiting.add_request(new_request(value))
        elif kind == "admit":
            for _ in range(min(value, len(waiting))):
                waiting.pop_request()
        elif kind == "preempt":
            waiting.prepend_request(new_request(value))
        elif kind in ("abort", "abort_and_arrive") and waiting:
            waiting.remove_request(list(waiting)[value % len(waiting)])
            if kind == "abort_and_arrive":  # the queue keeps its length and its head
                waiting.add_request(new_request(value + 1))
        elif kind == "slots":
            slots = max(slots + value, 0) if value >= 0 else max(slots - 2, 0)
        elif kind == "budget":
            budget = value
        carried = planner.plan(sched, slots, budget, CHUNK, NO_PARTIALS)
        assert carried == plan_admissions(sched, slots, budget, CHUNK, NO_PARTIALS), (kind, value)
