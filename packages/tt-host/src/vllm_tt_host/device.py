"""``HostMeshDevice``: the object host reference models receive as ``mesh_device``.

It stands where a ``ttnn.MeshDevice`` stands: it has a shape, splits into sub-meshes (lanes)
and keeps the traces captured at warmup. Replaying a shape that warmup did not capture is an
error, as it is on hardware. Programs go through one command queue shared by the sub-meshes;
with modelled device time (``HostDeviceOptions.device_time``) they run on the device's own
thread and take the modelled time, and readbacks complete through events.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from vllm.logger import init_logger
from vllm_tt_platform.cost.device_time import DeviceTimeSpec, ModelDims, ProgramCosts
from vllm_tt_platform.faults import Faults
from vllm_tt_platform.mesh.shape import MeshShape

from vllm_tt_host.command_queue import CommandQueue, DeviceEvent

logger = init_logger("vllm." + __name__)


@dataclass(frozen=True)
class HostDeviceOptions:
    """How the emulated device behaves (``--additional-config.tt.host_*``)."""

    device_time: DeviceTimeSpec | None = None
    """None: programs take as long as the host math; else the modelled duration."""
    skip_math: bool = False
    """Models return deterministic stand-in tokens instead of running the real math."""
    preset: str | None = None
    """The ``MESH_DEVICE`` preset the mesh was opened for (picks the chip of the cost model)."""


class TraceNotCapturedError(RuntimeError):
    """A program was replayed with a shape no warmup captured a trace for."""


class HostMeshDevice:
    def __init__(self, shape: MeshShape, *, lane: int | None = None,
                 options: HostDeviceOptions | None = None, command_queue: CommandQueue | None = None) -> None:
        self.mesh_shape = shape
        self.lane = lane
        self.options = options or HostDeviceOptions()
        self.command_queue = command_queue or CommandQueue(timed=self.options.device_time is not None)
        self._owns_queue = command_queue is None
        self._traces: set[Hashable] = set()
        self._missed: set[Hashable] = set()
        self._lock = threading.Lock()
        self._submeshes: list[HostMeshDevice] = []
        self.closed = False

    # The subset of the ttnn.MeshDevice API that models use.
    @property
    def shape(self) -> tuple[int, int]:
        return (self.mesh_shape.rows, self.mesh_shape.cols)

    def get_num_devices(self) -> int:
        return self.mesh_shape.num_devices

    def create_submeshes(self, lanes: int) -> list[HostMeshDevice]:
        """Split into ``lanes`` equal sub-meshes (one per data-parallel KV cache)."""
        sub = self.mesh_shape.split(lanes)
        self._submeshes = [
            HostMeshDevice(sub, lane=i, options=self.options, command_queue=self.command_queue)
            for i in range(lanes)
        ]
        return list(self._submeshes)

    # Time and events.
    @property
    def skip_math(self) -> bool:
        return self.options.skip_math

    def program_costs(self, served: ModelDims, lanes: int = 1) -> ProgramCosts | None:
        """Durations of the programs a model of dimensions ``served`` runs here, on one of
        ``lanes`` equal sub-meshes; None when device time is not modelled."""
        spec = self.options.device_time
        if spec is None:
            return None
        return spec.resolve(served, self.mesh_shape, self.options.preset, lanes)

    @property
    def modelled_device_seconds(self) -> float | None:
        """Modelled device time of the programs completed so far (the TT metrics read it per
        step); None when device time is not modelled."""
        if self.options.device_time is None:
            return None
        return self.command_queue.stats.modelled_s

    def event_synchronize(self, event: Any) -> None:
        """Block until ``event`` (from a readback) is recorded, like ``ttnn.event_synchronize``."""
        if not isinstance(event, DeviceEvent):
            raise TypeError(f"expected an event recorded by this host device, got {type(event).__name__}")
        event.wait()

    def synchronize(self) -> None:
        """Block until every queued program has completed."""
        self.command_queue.finish()

    @property
    def faults(self) -> Faults:
        return self.command_queue.faults

    @faults.setter
    def faults(self, faults: Faults) -> None:
        self.command_queue.faults = faults

    # Traces.
    def capture_trace(self, key: Hashable, duration_s: float = 0.0) -> float:
        """Capture the trace of ``key``'s shape: it runs the program once, so with modelled
        device time it takes ``duration_s`` (the program's cost). Logged with the shape and the
        time it took, which it returns."""
        start = time.perf_counter()
        if duration_s > 0:
            self.command_queue.submit(lambda: None, duration_s).result()
        with self._lock:
            self._traces.add(key)
        elapsed = time.perf_counter() - start
        where = "" if self.lane is None else f" on lane {self.lane}"
        logger.info("TT warmup: captured trace %s%s in %.3f s", key, where, elapsed)
        return elapsed

    def replay_trace(self, key: Hashable) -> None:
        with self._lock:
            if key not in self._traces:
                captured = ", ".join(sorted(map(str, self._traces))) or "none"
                if key not in self._missed:  # logged once per shape, also if a caller recovers
                    self._missed.add(key)
                    logger.error("TT trace shape %s met at run time was not captured at warmup (captured: %s)",
                                 key, captured)
                raise TraceNotCapturedError(
                    f"no trace was captured for {key!r} (captured: {captured}); "
                    "warmup must capture every shape the runner serves"
                )

    @property
    def captured_traces(self) -> frozenset[Hashable]:
        with self._lock:
            return frozenset(self._traces)

    def close(self) -> None:
        for sub in self._submeshes:
            sub.close()
        if self._owns_queue:
            self.command_queue.close()
        self._traces.clear()
        self.closed = True
