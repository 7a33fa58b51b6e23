"""The delay-injection harness: scripted delays and races hit exactly the chosen occurrences,
random ones are reproducible from their seed, and the default injects nothing."""

from __future__ import annotations

import threading

from vllm_tt_platform.faults import NO_FAULTS, DelayPoint
from vllm_tt_testing.faults import RandomFaults, ScriptedFaults


def test_scripted_delays_hit_the_chosen_occurrences():
    slept: list[float] = []
    faults = ScriptedFaults(delays={(DelayPoint.FINALISE, 1): 0.25, (DelayPoint.SUBMIT, 0): 0.5},
                            sleep=slept.append)
    for point in (DelayPoint.SUBMIT, DelayPoint.FINALISE, DelayPoint.FINALISE, DelayPoint.SUBMIT):
        faults.delay(point)
    assert slept == [0.5, 0.25]
    assert faults.events == [(DelayPoint.SUBMIT, 0), (DelayPoint.FINALISE, 0), (DelayPoint.FINALISE, 1),
                             (DelayPoint.SUBMIT, 1)]


def test_scripted_races_finalise_the_chosen_steps_from_another_thread():
    finalised: list[tuple[int, str]] = []
    faults = ScriptedFaults(race_steps=[1])

    def finaliser(step: int):
        return lambda: finalised.append((step, threading.current_thread().name))

    for step in range(3):
        faults.race(finaliser(step))
    for thread in faults.threads:
        thread.join()
    assert finalised == [(1, "tt-raced-finalise-1")]


def test_random_delays_are_reproducible_and_races_are_joined():
    def decisions(seed: int) -> list[float]:
        slept: list[float] = []
        faults = RandomFaults(seed=seed, max_delay_s=0.01, sleep=slept.append)
        for _ in range(50):
            faults.delay(DelayPoint.READBACK)
        return slept

    assert decisions(3) == decisions(3) != decisions(4)
    assert 0 < len(decisions(3)) < 50 and all(0 <= s <= 0.01 for s in decisions(3))
    slept: list[float] = []
    only_submit = RandomFaults(points=frozenset({DelayPoint.SUBMIT}), delay_probability=1.0, sleep=slept.append)
    only_submit.delay(DelayPoint.APPLY)
    assert slept == []
    only_submit.delay(DelayPoint.SUBMIT)
    assert len(slept) == 1

    ran = []

    def broken():
        ran.append(threading.current_thread().name)
        raise RuntimeError("kept by the step, not raised here")

    racer = RandomFaults(race_probability=1.0, sleep=lambda s: None)
    racer.race(broken)
    racer.join()
    assert ran == ["tt-raced-finalise"]


def test_no_faults_does_nothing():
    NO_FAULTS.delay(DelayPoint.SUBMIT)
    NO_FAULTS.race(lambda: (_ for _ in ()).throw(AssertionError("raced")))
