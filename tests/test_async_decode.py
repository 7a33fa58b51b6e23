"""The runner's overlapped-decode machinery on its own: exactly-once finalisation from any
thread, in-order application, the drain rule for each kind of step, and ``reset_batch``."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm import SamplingParams
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_platform.faults import DelayPoint, Faults
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_platform.runner import async_decode
from vllm_tt_platform.runner.async_decode import (
    DecodeOverlap,
    InFlightStep,
    SteadySampling,
    StepRow,
    TTAsyncOutput,
    event_synchronizer,
    overlap_for,
)
from vllm_tt_platform.runner.batch import PersistentBatch
from vllm_tt_platform.runner.model_output import ModelOutput
from vllm_tt_platform.runner.step import ScheduledRow
from vllm_tt_sampling.decision import DeviceSamplingCaps, DeviceSamplingMode
from vllm_tt_testing.faults import ScriptedFaults

GREEDY = SamplingParams(temperature=0.0, max_tokens=100)
DEVICE = SteadySampling(DeviceSamplingMode.ALL, DeviceSamplingCaps())


def make_batch(*specs: tuple[str, SamplingParams], rows: int = 4) -> PersistentBatch:
    batch = PersistentBatch(1, rows)
    for req_id, params in specs:
        batch.add(req_id, [1, 2, 3], params, ([1],), 3, 0)
    return batch


def make_overlap(**kwargs) -> DecodeOverlap:
    return DecodeOverlap(enabled=True, sampling=kwargs.pop("sampling", DEVICE), synchronize=lambda e: None, **kwargs)


def rows_of(batch: PersistentBatch, *req_ids: str) -> list[ScheduledRow]:
    return [ScheduledRow(batch.requests[r], 1) for r in req_ids]


def submit(overlap: DecodeOverlap, batch: PersistentBatch, tokens: list[int], *req_ids: str) -> InFlightStep:
    """Submit a step whose device output gives slot ``s`` the token ``tokens[s]``."""
    return overlap.submit(None, torch.tensor(tokens), rows_of(batch, *req_ids))


def step_with(read, rows=()) -> InFlightStep:
    return InFlightStep(0, rows, read, Faults())


def test_finalisation_runs_once_whichever_threads_race():
    batch = make_batch(("a", GREEDY), ("b", GREEDY))
    reads = []
    gate = threading.Barrier(9)

    def read():
        reads.append(threading.current_thread().name)
        return ModelOutput(tokens=torch.tensor([11, 22, 0, 0]))

    step = step_with(read, [StepRow("a", 0, batch.requests["a"]), StepRow("b", 1, batch.requests["b"])])
    results = []

    def race():
        gate.wait()
        results.append(TTAsyncOutput(step).get_output())

    threads = [threading.Thread(target=race, name=f"racer-{i}") for i in range(8)]
    for t in threads:
        t.start()
    gate.wait()
    results.append(step.finalise())
    for t in threads:
        t.join()
    assert len(reads) == 1  # one finalisation body ran, on whichever thread got there first
    assert all(r is results[0] for r in results) and len(results) == 9
    assert results[0].req_ids == ["a", "b"] and results[0].sampled_token_ids == [[11], [22]]
    assert results[0].req_id_to_index == {"a": 0, "b": 1}


def test_a_failed_readback_fails_every_caller_once():
    calls = []

    def read():
        calls.append(1)
        raise RuntimeError("device lost")

    step = step_with(read)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="device lost"):
            step.finalise()
    assert calls == [1] and step.finalised


def test_async_output_is_vllms_async_output():
    step = step_with(lambda: ModelOutput(tokens=torch.tensor([5])))
    output = make_overlap().async_output(step, None)
    assert isinstance(output, AsyncModelRunnerOutput)
    assert output.get_kv_connector_output() is None and output.get_output().sampled_token_ids == []
    with pytest.raises(RuntimeError, match="grammar bitmask"):
        make_overlap().async_output(step, object())


def test_steps_are_applied_in_submission_order_once_finalised():
    batch = make_batch(("a", GREEDY))
    overlap = make_overlap()
    first = submit(overlap, batch, [7, 0, 0, 0], "a")
    second = submit(overlap, batch, [8, 0, 0, 0], "a")
    assert overlap.stats.submitted == 2 and overlap.stats.overlapped == 1
    second.finalise()
    overlap.apply_ready(batch)
    assert batch.requests["a"].output_token_ids == [] and len(overlap.in_flight) == 2
    first.finalise()
    overlap.apply_ready(batch)
    assert batch.requests["a"].output_token_ids == [7, 8] and not overlap.in_flight


class FinaliseDuringApply(Faults):
    """At the first application, another thread finalises ``target`` (the ordering that loses
    a token when resolved steps are pruned apart from applying them)."""

    def __init__(self) -> None:
        self.target: InFlightStep | None = None
        self.fired = False

    def delay(self, point: DelayPoint) -> None:
        if point is DelayPoint.APPLY and not self.fired and self.target is not None:
            self.fired = True
            thread = threading.Thread(target=self.target.finalise)
            thread.start()
            thread.join()


def test_a_step_finalised_while_another_is_applied_is_not_lost():
    batch = make_batch(("a", GREEDY))
    faults = FinaliseDuringApply()
    overlap = make_overlap()
    overlap.faults = faults
    first = submit(overlap, batch, [7, 0, 0, 0], "a")
    faults.target = submit(overlap, batch, [8, 0, 0, 0], "a")
    first.finalise()
    overlap.apply_ready(batch)
    assert faults.fired and batch.requests["a"].output_token_ids == [7, 8] and not overlap.in_flight
    overlap.drain(batch, "test")
    assert batch.requests["a"].output_token_ids == [7, 8] and not overlap.stats.drains


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.just(("submit",)), st.just(("apply",)), st.just(("drain",)),
                          st.tuples(st.just("finalise"), st.integers(0, 5))), max_size=40))
def test_in_flight_means_exactly_not_yet_applied(actions):
    """Any interleaving of submissions, finalisations (by any thread), applications and drains:
    a request's host tokens are the tokens of the steps no longer in flight, in order, once."""
    batch = make_batch(("a", GREEDY))
    overlap = make_overlap()
    overlap.faults = recorder = ScriptedFaults()
    steps: list[InFlightStep] = []
    for action in actions:
        if action[0] == "submit":
            if len(overlap.in_flight) < overlap.depth:
                steps.append(submit(overlap, batch, [100 + len(steps), 0, 0, 0], "a"))
        elif action[0] == "finalise":
            if steps:
                thread = threading.Thread(target=steps[action[1] % len(steps)].finalise)
                thread.start()
                thread.join()
        elif action[0] == "apply":
            overlap.apply_ready(batch)
        else:
            overlap.drain(batch, "test")
        done = len(steps) - len(overlap.in_flight)
        assert list(overlap.in_flight) == steps[done:]
        assert batch.requests["a"].output_token_ids == [100 + i for i in range(done)]
    # The exactly-once section ran once per finalised step, however many callers raced.
    finalisations = [e for e in recorder.events if e[0] is DelayPoint.FINALISE]
    assert len(finalisations) == sum(step.finalised for step in steps)


def test_tokens_of_requests_that_left_are_discarded_not_given_to_the_slots_next_owner():
    batch = make_batch(("a", GREEDY))
    overlap = make_overlap()
    step = submit(overlap, batch, [7, 0, 0, 0], "a")
    batch.finish("a")
    newcomer = batch.add("b", [4, 5], GREEDY, ([2],), 2, 0)
    assert newcomer.slot == 0
    step.finalise()
    overlap.apply_ready(batch)
    assert newcomer.output_token_ids == [] and overlap.stats.discarded_tokens == 1


def scheduler_output(scheduled: dict[str, int], **changes) -> SimpleNamespace:
    base = dict(
        total_num_scheduled_tokens=sum(scheduled.values()), scheduled_new_reqs=[],
        scheduled_cached_reqs=SimpleNamespace(resumed_req_ids=set()), preempted_req_ids=set(),
        finished_req_ids=set(), num_scheduled_tokens=scheduled, has_structured_output_requests=False,
        pending_structured_output_tokens=False,
    )
    if "resumed" in changes:
        base["scheduled_cached_reqs"] = SimpleNamespace(resumed_req_ids=changes.pop("resumed"))
    base.update(changes)
    return SimpleNamespace(**base)


STEADY = {"a": 1, "b": 1}
BLOCKERS = [
    # (id, scheduler output, params of b, expected reason)
    ("steady", scheduler_output(STEADY), GREEDY, None),
    ("seeded steady", scheduler_output(STEADY), SamplingParams(temperature=0.8, top_k=20, seed=3), None),
    ("min_tokens met", scheduler_output(STEADY), SamplingParams(temperature=0.0, min_tokens=2), None),
    ("finished elsewhere", scheduler_output(STEADY, finished_req_ids={"gone"}), GREEDY, None),
    ("empty", scheduler_output({}), GREEDY, "empty step"),
    ("new", scheduler_output(STEADY, scheduled_new_reqs=[object()]), GREEDY, "new request"),
    ("resumed", scheduler_output(STEADY, resumed={"b"}), GREEDY, "resumed request"),
    ("preempted", scheduler_output({"a": 1}, preempted_req_ids={"b"}), GREEDY, "preempted request"),
    ("finished", scheduler_output({"a": 1}, finished_req_ids={"b"}), GREEDY, "finished request"),
    ("row left out", scheduler_output({"a": 1}), GREEDY, "rows changed"),
    ("row added", scheduler_output({"a": 1, "b": 1, "c": 1}), GREEDY, "rows changed"),
    ("chunk", scheduler_output({"a": 1, "b": 3}), GREEDY, "not a decode step"),
    ("structured", scheduler_output(STEADY, has_structured_output_requests=True), GREEDY, "structured output"),
    ("grammar pending", scheduler_output(STEADY, pending_structured_output_tokens=True), GREEDY,
     "structured output"),
    ("penalties", scheduler_output(STEADY), SamplingParams(repetition_penalty=1.2), "penalties"),
    ("logprobs", scheduler_output(STEADY), SamplingParams(temperature=0.0, logprobs=0), "logprobs"),
    ("top_k beyond device", scheduler_output(STEADY), SamplingParams(temperature=0.8, top_k=100),
     "host sampling (top_k_exceeds_device)"),
    ("min_tokens unmet", scheduler_output(STEADY), SamplingParams(temperature=0.0, min_tokens=5),
     "host sampling (min_tokens)"),
    ("logit_bias", scheduler_output(STEADY), SamplingParams(temperature=0.0, logit_bias={3: 1.0}),
     "host sampling (logit_bias)"),
]


@pytest.mark.parametrize(("out", "params", "reason"), [c[1:] for c in BLOCKERS], ids=[c[0] for c in BLOCKERS])
def test_drain_rule(out, params, reason):
    batch = make_batch(("a", GREEDY), ("b", params))
    batch.requests["b"].output_token_ids.extend([9, 9])
    overlap = make_overlap()
    step = submit(overlap, batch, [7, 8, 0, 0], "a", "b")
    assert overlap.blocker(out, batch) == reason
    overlap.begin_step(out, batch)
    if reason is None:
        assert list(overlap.in_flight) == [step] and not overlap.stats.drains  # kept
    else:
        assert not overlap.in_flight and overlap.stats.drains == {reason: 1}  # drained and applied
        assert batch.requests["a"].output_token_ids == [7]


def test_decode_step_kept_only_with_device_sampling_and_no_host_work():
    batch = make_batch(("a", GREEDY))
    overlap = make_overlap()
    assert overlap.prepare_decode(batch, device_sampled=True, penalties=False, logprobs=False)
    for kwargs, reason in (
        (dict(device_sampled=False, penalties=False, logprobs=False), "host sampling"),
        (dict(device_sampled=True, penalties=True, logprobs=False), "penalties"),
        (dict(device_sampled=True, penalties=False, logprobs=True), "logprobs"),
    ):
        submit(overlap, batch, [7, 0, 0, 0], "a")
        assert not overlap.prepare_decode(batch, **kwargs)
        assert not overlap.in_flight and overlap.stats.drains[reason] == 1
        assert overlap.stats.not_overlapped[reason] == 1
    off = DecodeOverlap(enabled=False, sampling=DEVICE, synchronize=lambda e: None)
    assert not off.prepare_decode(batch, device_sampled=True, penalties=False, logprobs=False)
    assert not off.stats.not_overlapped


def test_depth_bounds_the_steps_in_flight():
    batch = make_batch(("a", GREEDY))
    overlap = make_overlap()
    for token in (1, 2):
        submit(overlap, batch, [token, 0, 0, 0], "a")
    assert overlap.prepare_decode(batch, device_sampled=True, penalties=False, logprobs=False)
    assert len(overlap.in_flight) == 1 and batch.requests["a"].output_token_ids == [1]


def test_reset_batch_marks_layout_changes():
    batch = make_batch(("a", GREEDY), ("b", GREEDY))
    overlap = make_overlap()
    both, only_a = rows_of(batch, "a", "b"), rows_of(batch, "a")
    assert overlap.reset_batch(both, device_sampled=True) is True
    assert overlap.reset_batch(both, device_sampled=True) is False
    assert overlap.reset_batch(only_a, device_sampled=True) is True
    overlap.batch_changed()
    assert overlap.reset_batch(only_a, device_sampled=True) is True
    assert overlap.reset_batch(only_a, device_sampled=False) is None
    assert overlap.reset_batch(only_a, device_sampled=True) is True


@pytest.mark.parametrize(("async_scheduling", "supports", "trace", "mode", "compat", "enabled"), [
    (True, True, True, DeviceSamplingMode.ALL, False, True),
    (True, True, True, DeviceSamplingMode.DECODE_ONLY, False, True),
    (False, True, True, DeviceSamplingMode.ALL, False, False),
    (True, False, True, DeviceSamplingMode.ALL, False, False),
    (True, True, False, DeviceSamplingMode.ALL, False, False),
    (True, True, True, None, False, False),
    (True, True, True, DeviceSamplingMode.ALL, True, False),
])
def test_overlap_needs_async_scheduling_capability_trace_and_device_sampling(
        async_scheduling, supports, trace, mode, compat, enabled):
    sampling = SteadySampling(mode, DeviceSamplingCaps(), always_compat=compat)
    overlap = overlap_for(async_scheduling=async_scheduling, supports_async_decode=supports, decode_trace=trace,
                          sampling=sampling, mesh_device=HostMeshDevice(MeshShape(1, 1)))
    assert overlap.enabled is enabled


def test_events_are_waited_on_through_the_mesh(monkeypatch):
    mesh = HostMeshDevice(MeshShape(1, 1))
    assert event_synchronizer(mesh) == mesh.event_synchronize
    import ttnn

    waited = []
    monkeypatch.setattr(ttnn, "event_synchronize", waited.append, raising=False)
    event_synchronizer(object())("ev")
    assert waited == ["ev"]


def test_submission_reads_back_through_the_models_events():
    """A device handle is read back with ``read_decode_output(async_read=True)`` at submission;
    finalisation waits on every event before converting the output."""
    order = []

    class Model:
        def read_decode_output(self, raw, async_read=False):
            order.append(("read", async_read))
            return ("host", raw), ["e1", "e2"]

        def process_decode_output_host(self, out, is_tokens=False):
            order.append(("process", is_tokens))
            return torch.tensor([4, 5])

    batch = make_batch(("a", GREEDY), ("b", GREEDY))
    overlap = DecodeOverlap(enabled=True, sampling=DEVICE, synchronize=lambda e: order.append(("wait", e)))
    step = overlap.submit(Model(), object(), rows_of(batch, "a", "b"))
    assert order == [("read", True)]
    assert step.tokens == [4, 5]
    assert order == [("read", True), ("wait", "e1"), ("wait", "e2"), ("process", True)]
    assert async_decode.DEPTH == 2
