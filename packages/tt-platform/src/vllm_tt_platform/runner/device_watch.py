"""``DeviceWatch``: every device call of the runner ends, and fails under one name.

A model call that raises, a readback whose output breaks the contract, and a readback that
never completes all become a ``TTDeviceError`` naming the call, so the engine stops with one
clear message instead of an ``IndexError`` deep in the output code or a hang. Readbacks wait
on a watcher thread with ``readback_timeout_s`` (``ttnn.event_synchronize`` has no timeout).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from vllm_tt_platform.errors import TTDeviceError, TTReadbackTimeoutError

T = TypeVar("T")


class DeviceWatch:
    def __init__(self, readback_timeout_s: float) -> None:
        self.readback_timeout_s = readback_timeout_s
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], concurrent.futures.Future[object]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def call(self, what: str) -> Iterator[None]:
        """Turn any error of the device call ``what`` into a ``TTDeviceError``."""
        try:
            yield
        except TTDeviceError:
            raise
        except Exception as exc:
            raise TTDeviceError(what, f"{type(exc).__name__}: {exc}") from exc

    def read(self, what: str, read: Callable[[], T]) -> T:
        """Run the blocking readback ``read`` and return its result, or raise a
        ``TTReadbackTimeoutError`` once ``readback_timeout_s`` has passed (the stuck read is
        left on the watcher thread, a daemon, so the process can still exit)."""
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        self._jobs.put((read, future))
        self._start()
        with self.call(what):
            try:
                return future.result(timeout=self.readback_timeout_s)  # type: ignore[return-value]
            except concurrent.futures.TimeoutError:
                if future.done():
                    raise
                raise TTReadbackTimeoutError(what, self.readback_timeout_s) from None

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tt-readback-watch", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            read, future = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(read())
            except BaseException as exc:  # noqa: BLE001 - raised by read() above
                future.set_exception(exc)
