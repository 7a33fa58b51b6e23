"""The phase decision as a table: queue view and counters in, phase out."""

from __future__ import annotations

import pytest
from vllm_tt_scheduler.phase import Phase
from vllm_tt_scheduler.policy import PhasePolicy, WorkView

P, D, E = Phase.PREFILL, Phase.DECODE, Phase.EMPTY


@pytest.mark.parametrize(
    ("view", "burst", "debt", "expected"),
    [
        # nothing runs: prefill if there is prefill work, else an empty step
        (WorkView(decodes=0, partials=0, admissible=0), 0, 0, E),
        (WorkView(decodes=0, partials=0, admissible=3), 0, 0, P),
        (WorkView(decodes=0, partials=1, admissible=0), 0, 0, P),
        (WorkView(decodes=0, partials=0, admissible=0, must_scan=True), 0, 0, P),
        # decodes run and nothing can be admitted: decode
        (WorkView(decodes=4, partials=0, admissible=0), 0, 0, D),
        # the burst bound wins over every reason to prefill
        (WorkView(decodes=4, partials=1, admissible=0), 2, 0, D),
        (WorkView(decodes=4, partials=0, admissible=4, full=True), 2, 0, D),
        (WorkView(decodes=4, partials=0, admissible=0, must_scan=True), 2, 0, D),
        # chunks in flight, a grammar error to report, a full prefill step: prefill
        (WorkView(decodes=4, partials=1, admissible=0), 1, 0, P),
        (WorkView(decodes=4, partials=0, admissible=0, must_scan=True), 0, 0, P),
        (WorkView(decodes=4, partials=0, admissible=2, full=True), 0, 0, P),
        # otherwise admissions wait until debt + admissible >= 0.5 x decodes x steps
        (WorkView(decodes=4, partials=0, admissible=1), 0, 0, D),
        (WorkView(decodes=4, partials=0, admissible=1), 0, 1, P),
        (WorkView(decodes=4, partials=0, admissible=2), 0, 0, P),
        (WorkView(decodes=4, partials=0, admissible=2, steps=3), 0, 3, D),
        (WorkView(decodes=4, partials=0, admissible=2, steps=3), 0, 4, P),
    ],
)
def test_plan(view: WorkView, burst: int, debt: int, expected: Phase) -> None:
    policy = PhasePolicy(prefill_burst=2, hold_ratio=0.5, burst=burst, debt=debt)
    assert policy.plan(view) is expected


def test_zero_hold_admits_at_once() -> None:
    policy = PhasePolicy(prefill_burst=1, hold_ratio=0.0)
    assert policy.plan(WorkView(decodes=32, partials=0, admissible=1)) is P


def test_observe_counts_stalling_prefills_and_waiting() -> None:
    policy = PhasePolicy(prefill_burst=2, hold_ratio=0.5)
    waiting = WorkView(decodes=4, partials=0, admissible=1)
    policy.observe(D, waiting)
    policy.observe(D, waiting)
    assert (policy.burst, policy.debt) == (0, 2)
    policy.observe(P, waiting)
    assert (policy.burst, policy.debt) == (1, 0)
    policy.observe(P, waiting)
    assert policy.burst == 2
    policy.observe(E, waiting)  # an empty step changes nothing
    assert (policy.burst, policy.debt) == (2, 0)
    policy.observe(D, WorkView(decodes=4, partials=0, admissible=0))
    assert (policy.burst, policy.debt) == (0, 0)
    policy.observe(P, WorkView(decodes=0, partials=0, admissible=3))  # nothing stalled
    assert policy.burst == 0
