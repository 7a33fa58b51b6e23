"""The emulated device's command queue: programs run one after another, in submission order.

Without modelled time the queue runs each program on the caller's thread at once (the host
backend's original behaviour). With modelled time it behaves like a device: programs run on
the device's own worker thread, each completes no earlier than its modelled duration after it
started, and the host learns of completion through a recorded ``DeviceEvent``, which
``HostMeshDevice.event_synchronize`` waits on as ``ttnn.event_synchronize`` does.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vllm.logger import init_logger
from vllm_tt_platform.faults import NO_FAULTS, DelayPoint, Faults

logger = init_logger("vllm." + __name__)

CLOSE_TIMEOUT_S = 5.0
"""How long closing waits for the device thread to finish what was queued."""


class DeviceEvent:
    """Recorded when the operation it belongs to has completed on the device."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def record(self) -> None:
        self._done.set()

    @property
    def recorded(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()


class DeviceFuture:
    """The outcome of one queued operation; ``result()`` blocks until its event is recorded."""

    def __init__(self) -> None:
        self.event = DeviceEvent()
        self._value: Any = None
        self._error: BaseException | None = None

    def _complete(self, value: Any, error: BaseException | None) -> None:
        self._value, self._error = value, error
        self.event.record()

    def done(self) -> bool:
        return self.event.recorded

    def result(self) -> Any:
        self.event.wait()
        if self._error is not None:
            raise self._error
        return self._value


@dataclass
class QueueStats:
    """What the device did: for benchmarks and tests of the time model."""

    programs: int = 0
    readbacks: int = 0
    busy_s: float = 0.0
    """Wall time the device spent executing (compute plus modelled waiting)."""
    modelled_s: float = 0.0
    """Sum of the modelled durations of the programs (readbacks excluded)."""


@dataclass
class _Op:
    fn: Callable[[], Any]
    duration_s: float
    readback: bool
    future: DeviceFuture = field(default_factory=DeviceFuture)


class CommandQueue:
    """FIFO execution of device operations; ``deferred`` says whether they run on a thread."""

    def __init__(self, *, timed: bool, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.deferred = timed
        self._clock, self._sleep = clock, sleep
        self.faults: Faults = NO_FAULTS
        self.stats = QueueStats()
        self._ops: queue.SimpleQueue[_Op | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[[], Any], duration_s: float = 0.0, *, readback: bool = False) -> DeviceFuture:
        """Queue ``fn``; it completes no earlier than ``duration_s`` after it starts (timed
        queues only). Errors raised by ``fn`` are raised by ``result()``."""
        op = _Op(fn, max(0.0, duration_s), readback)
        if not self.deferred:
            self._run(op)
            return op.future
        with self._lock:
            if self._closed:
                raise RuntimeError("the host mesh device is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tt-host-device", daemon=True)
                self._thread.start()
        self._ops.put(op)
        return op.future

    def _loop(self) -> None:
        while (op := self._ops.get()) is not None:
            self._run(op)

    def _run(self, op: _Op) -> None:
        start = self._clock()
        value: Any = None
        error: BaseException | None = None
        try:
            value = op.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever reads the result
            error = exc
        if self.deferred:
            remaining = start + op.duration_s - self._clock()
            if remaining > 0:
                self._sleep(remaining)
            if op.readback:
                self.faults.delay(DelayPoint.READBACK)
                if error is None:
                    value = self.faults.readback(value)
        stats = self.stats
        stats.busy_s += self._clock() - start
        if op.readback:
            stats.readbacks += 1
        else:
            stats.programs += 1
            stats.modelled_s += op.duration_s
        op.future._complete(value, error)

    def finish(self) -> None:
        """Block until every queued operation has completed (``ttnn.synchronize_device``)."""
        self.submit(lambda: None).result()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the device thread once it has run what was queued; a device stuck in an
        operation (a readback that never completes) is left behind after ``timeout_s``, so a
        failing engine still exits (the thread is a daemon)."""
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
        if thread is not None:
            self._ops.put(None)
            thread.join(timeout_s)
            if thread.is_alive():
                logger.warning("TT host device: an operation was still running %.0f s after close; "
                               "leaving the device thread behind", timeout_s)
