"""Overlapped decode: submit decode step N+1 while step N's tokens are still being read back.

With ``--async-scheduling``, vLLM schedules step N+1 before it has processed step N's output,
and ``sample_tokens`` may return an ``AsyncModelRunnerOutput`` whose ``get_output()`` resolves
the tokens later. On a steady decode step the runner submits the decode without waiting
(``read_from_device=False``), starts a non-blocking readback (``read_decode_output(...,
async_read=True)``) and keeps the step in a queue of depth 2. The device feeds each slot's sampled
token back itself (contract §3.3a), so the host's copy of the tokens may lag.

A step's life, and who does what:

* **finalise** (exactly once, whichever thread gets there first: vLLM's ``get_output()`` on its
  output thread, a drain on the runner thread, or an injected race): wait on the readback events,
  read the tokens, build the ``ModelRunnerOutput``. It never touches the host batch.
* **apply** (runner thread only, in submission order): append each token to its request's host
  state, unless the request has left the batch. A step leaves the queue only by being applied,
  so "nothing in flight" always means "every token applied"; there is no separate bookkeeping of
  resolved steps that could disagree with it (the reference plugin's open race).
* **drain** (runner thread, before any step that is not steady): finalise and apply everything
  in flight, oldest first, then let the runner build the new step from up-to-date host state.

Steady means: a decode step of exactly the requests of the step in flight (nothing new, resumed,
preempted, finished or left out), device sampling, decode traces, no structured output, and no
request needing host sampling work (penalties, logprobs, host-only logits processors).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput
from vllm_tt_sampling.decision import (
    DeviceSamplingCaps,
    DeviceSamplingMode,
    RowSampling,
    SamplingPath,
    choose_sampling_path,
)

from vllm_tt_platform.faults import NO_FAULTS, DelayPoint, Faults
from vllm_tt_platform.runner import model_output
from vllm_tt_platform.runner.device_watch import DeviceWatch

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from vllm_tt_platform.runner.batch import PersistentBatch, RequestState
    from vllm_tt_platform.runner.step import ScheduledRow

logger = init_logger("vllm." + __name__)

DEPTH = 2
"""Steps in flight at most: the one being read back and the one just submitted."""


@dataclass(frozen=True)
class StepRow:
    """One request of an in-flight step, as it was when the step was submitted."""

    req_id: str
    slot: int
    state: RequestState


class InFlightStep:
    """A submitted decode step whose tokens the host has not applied yet."""

    def __init__(self, index: int, rows: Sequence[StepRow], read: Callable[[], model_output.ModelOutput],
                 faults: Faults) -> None:
        self.index = index
        self.rows = tuple(rows)
        self.req_ids = frozenset(r.req_id for r in self.rows)
        self._read = read
        self._faults = faults
        self._lock = threading.Lock()
        self._finalised = False
        self._tokens: list[int] = []
        self._output: ModelRunnerOutput | None = None
        self._error: BaseException | None = None

    @property
    def finalised(self) -> bool:
        return self._finalised

    def finalise(self) -> ModelRunnerOutput:
        """Wait for the readback and build the step's output, once; later callers (any
        thread) get the same output, or the same error."""
        with self._lock:
            if not self._finalised:
                self._faults.delay(DelayPoint.FINALISE)
                try:
                    tokens = self._read().tokens
                    if tokens is None:
                        raise model_output.ModelOutputError("an overlapped decode step returned no tokens")
                    self._tokens = [int(tokens[r.slot]) for r in self.rows]
                    self._output = ModelRunnerOutput(
                        req_ids=[r.req_id for r in self.rows],
                        req_id_to_index={r.req_id: i for i, r in enumerate(self.rows)},
                        sampled_token_ids=[[t] for t in self._tokens],
                    )
                except BaseException as exc:  # noqa: BLE001 - raised to every caller below
                    self._error = exc
                self._finalised = True
        if self._error is not None:
            raise self._error
        if self._output is None:
            raise RuntimeError(f"overlapped step {self.index} finalised without output")
        return self._output

    @property
    def tokens(self) -> list[int]:
        self.finalise()
        return self._tokens


class TTAsyncOutput(AsyncModelRunnerOutput):
    """What ``sample_tokens`` returns for an overlapped step; vLLM resolves it later."""

    def __init__(self, step: InFlightStep) -> None:
        self.step = step

    def get_output(self) -> ModelRunnerOutput:
        return self.step.finalise()

    def get_kv_connector_output(self) -> None:
        """TT has no KV connector."""
        return None


@dataclass(frozen=True)
class SteadySampling:
    """The sampling facts that decide whether a decode step can stay overlapped."""

    mode: DeviceSamplingMode | None
    caps: DeviceSamplingCaps
    always_compat: bool = False
    logits_processors: bool = False

    def host_work(self, states: Sequence[RequestState]) -> str | None:
        """Why these requests need the host between steps, or None. Penalties and logprobs
        need host state or host processing even when the device could do them; the rest is
        the runner's own sampling decision, taken on the host's (possibly lagging) token
        counts, which only errs towards the host (``min_tokens`` still unmet)."""
        rows = []
        for state in states:
            params = state.sampling_params
            if params.logprobs is not None or params.prompt_logprobs is not None:
                return "logprobs"
            if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
                return "penalties"
            rows.append(RowSampling.from_vllm(
                params, structured_output=False, intermediate_chunk=False,
                logits_processors_configured=self.logits_processors,
                num_output_tokens=len(state.output_token_ids),
            ))
        decision = choose_sampling_path(rows, mode=self.mode, prefill=False, caps=self.caps,
                                        always_compat=self.always_compat)
        return None if decision.path is SamplingPath.DEVICE else f"host sampling ({decision.reason})"


@dataclass
class OverlapStats:
    submitted: int = 0
    """Steps submitted without waiting for their tokens."""
    overlapped: int = 0
    """Of those, steps submitted while an earlier step was still in flight."""
    drains: collections.Counter[str] = field(default_factory=collections.Counter)
    """Drains of a non-empty queue, by reason."""
    not_overlapped: collections.Counter[str] = field(default_factory=collections.Counter)
    """Decode steps run synchronously while overlap is on, by reason."""
    applied: int = 0
    discarded_tokens: int = 0
    """Tokens of requests that left the batch before their step was applied."""


class DecodeOverlap:
    """The runner's overlapped-decode state: in-flight queue, drain policy, ``reset_batch``.

    Only the runner thread calls its methods; other threads only finalise steps."""

    def __init__(self, *, enabled: bool, sampling: SteadySampling, synchronize: Callable[[Any], None],
                 depth: int = DEPTH, watch: DeviceWatch | None = None) -> None:
        self.enabled = enabled
        self.watch = watch or DeviceWatch(readback_timeout_s=60.0)
        self.sampling = sampling
        self.synchronize = synchronize
        self.depth = depth
        self.faults: Faults = NO_FAULTS
        self.in_flight: collections.deque[InFlightStep] = collections.deque()
        self.stats = OverlapStats()
        self._next_index = 0
        self._layout: tuple[tuple[int, str], ...] | None = None
        self._layout_dirty = True
        self._host_work: tuple[frozenset[str], str | None] | None = None

    # -- the runner's hooks, in step order --------------------------------------------------
    def begin_step(self, out: SchedulerOutput, batch: PersistentBatch) -> None:
        """Before ``batch`` applies ``out``: apply finalised steps, and drain everything in
        flight unless ``out`` is a steady continuation of the last step."""
        self.apply_ready(batch)
        if self.in_flight:
            reason = self.blocker(out, batch)
            if reason is not None:
                self.drain(batch, reason)

    def batch_changed(self) -> None:
        """Requests took or gave back slots: the next device-sampled decode resets the batch."""
        self._layout_dirty = True
        self._host_work = None

    def prepare_decode(self, batch: PersistentBatch, *, device_sampled: bool, penalties: bool,
                       logprobs: bool) -> bool:
        """Whether this decode step is submitted overlapped. If not, everything in flight is
        drained first, so the caller builds its inputs from complete host state."""
        reason = None
        if not self.enabled:
            reason = "overlap off"
        elif not device_sampled:
            reason = "host sampling"
        elif penalties or logprobs:
            reason = "penalties" if penalties else "logprobs"
        if reason is not None:
            if self.enabled:
                self.stats.not_overlapped[reason] += 1
            if self.in_flight:
                self.drain(batch, reason)
            return False
        while len(self.in_flight) >= self.depth:
            self._finish_oldest(batch)
        return True

    def reset_batch(self, rows: Sequence[ScheduledRow], *, device_sampled: bool) -> bool | None:
        """``reset_batch`` for a device-sampled decode: the slot layout changed since the last
        one (sticky until sent). None for a host-sampled decode, which is not sent it: it makes
        the device reload inputs anyway."""
        if not device_sampled:
            self._layout_dirty = True
            return None
        layout = tuple(sorted((r.state.slot, r.state.req_id) for r in rows))
        reset = self._layout_dirty or layout != self._layout
        self._layout, self._layout_dirty = layout, False
        return reset

    def submit(self, model: Any, raw: Any, rows: Sequence[ScheduledRow], num_slots: int | None = None
               ) -> InFlightStep:
        """Start the readback of a submitted decode and queue the step; its tokens are read
        under the watch (bounded wait, checked to have ``num_slots`` rows)."""
        self.faults.delay(DelayPoint.SUBMIT)
        index = self._next_index
        what = f"decode step {index} readback"
        on_host = model_output.is_host_output(raw)
        if on_host:
            host_out, events = raw, []
        else:
            with self.watch.call(what):
                host_out, events = model.read_decode_output(raw, async_read=True)
            events = list(events)

        def wait_and_read() -> model_output.ModelOutput:
            for event in events:
                self.synchronize(event)
            return model_output.read_decode(model, host_out, sampled_on_device=True, rows=num_slots)

        def read() -> model_output.ModelOutput:  # host tensors have no readback to bound
            return wait_and_read() if on_host else self.watch.read(what, wait_and_read)

        step = InFlightStep(index, [StepRow(r.state.req_id, r.state.slot, r.state) for r in rows],
                            read, self.faults)
        self._next_index += 1
        self.stats.submitted += 1
        if self.in_flight:
            self.stats.overlapped += 1
        self.in_flight.append(step)
        self.faults.race(step.finalise)
        return step

    def async_output(self, step: InFlightStep, grammar_output: Any) -> TTAsyncOutput:
        if grammar_output is not None:
            raise RuntimeError(
                f"overlapped decode step {step.index} received a grammar bitmask; structured "
                "output steps must not be overlapped"
            )
        return TTAsyncOutput(step)

    # -- queue ------------------------------------------------------------------------------
    def blocker(self, out: SchedulerOutput, batch: PersistentBatch) -> str | None:
        """Why ``out`` cannot continue the step in flight, or None."""
        if out.total_num_scheduled_tokens == 0:
            return "empty step"
        if out.scheduled_new_reqs:
            return "new request"
        cached = out.scheduled_cached_reqs
        if cached.resumed_req_ids:
            return "resumed request"
        if out.preempted_req_ids:
            return "preempted request"
        if any(req_id in batch.requests for req_id in out.finished_req_ids):
            return "finished request"
        scheduled = out.num_scheduled_tokens
        if scheduled.keys() != self.in_flight[-1].req_ids:
            return "rows changed"
        if any(n != 1 for n in scheduled.values()):
            return "not a decode step"
        if getattr(out, "has_structured_output_requests", False) or getattr(
            out, "pending_structured_output_tokens", False
        ):
            return "structured output"
        return self._steady_host_work([batch.requests[req_id] for req_id in scheduled])

    def _steady_host_work(self, states: list[RequestState]) -> str | None:
        """``SteadySampling.host_work``, remembered while the rows stay the same (it depends on
        token counts only through ``min_tokens``)."""
        ids = frozenset(s.req_id for s in states)
        if self._host_work is not None and self._host_work[0] == ids:
            return self._host_work[1]
        reason = self.sampling.host_work(states)
        if not any(s.sampling_params.min_tokens for s in states):
            self._host_work = (ids, reason)
        return reason

    def apply_ready(self, batch: PersistentBatch) -> None:
        """Apply finalised steps from the front of the queue, in order."""
        while self.in_flight and self.in_flight[0].finalised:
            self._apply(self.in_flight.popleft(), batch)

    def drain(self, batch: PersistentBatch, reason: str) -> None:
        """Finalise and apply every step in flight, oldest first."""
        if self.in_flight:
            self.stats.drains[reason] += 1
            logger.debug("overlapped decode: draining %d step(s): %s", len(self.in_flight), reason)
        while self.in_flight:
            self._finish_oldest(batch)

    def _finish_oldest(self, batch: PersistentBatch) -> None:
        step = self.in_flight[0]
        step.finalise()
        self._apply(self.in_flight.popleft(), batch)

    def _apply(self, step: InFlightStep, batch: PersistentBatch) -> None:
        self.faults.delay(DelayPoint.APPLY)
        for row, token in zip(step.rows, step.tokens, strict=True):
            if batch.requests.get(row.req_id) is row.state:
                row.state.output_token_ids.append(token)
            else:
                self.stats.discarded_tokens += 1
        self.stats.applied += 1


def event_synchronizer(mesh_device: Any) -> Callable[[Any], None]:
    """How to wait on a readback event of this mesh: the host mesh device's own wait, else
    ``ttnn.event_synchronize``."""
    wait = getattr(mesh_device, "event_synchronize", None)
    if callable(wait):
        return wait

    def ttnn_wait(event: Any) -> None:
        import ttnn

        ttnn.event_synchronize(event)

    return ttnn_wait


def overlap_for(*, async_scheduling: bool, supports_async_decode: bool, decode_trace: bool,
                sampling: SteadySampling, mesh_device: Any, watch: DeviceWatch | None = None) -> DecodeOverlap:
    """The runner's overlap, on when vLLM schedules asynchronously, the model declares
    ``supports_async_decode`` and the device samples; logged once either way."""
    blockers = [why for why, ok in (
        ("--async-scheduling is off", async_scheduling),
        ("the model does not declare supports_async_decode", supports_async_decode),
        ("trace_mode none (the device feeds tokens back only inside a decode trace)", decode_trace),
        ("sampling is on the host (sample_on_device_mode unset or always_compat_sampling)",
         sampling.mode is not None and not sampling.always_compat),
    ) if not ok]
    if blockers:
        if async_scheduling:
            logger.info("Overlapped decode off: %s.", "; ".join(blockers))
    else:
        logger.info("Overlapped decode on: steady device-sampled decode steps are submitted before "
                    "the previous step's tokens are read back (depth %d).", DEPTH)
    return DecodeOverlap(enabled=not blockers, sampling=sampling, synchronize=event_synchronizer(mesh_device),
                         watch=watch)
