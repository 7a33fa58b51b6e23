"""``HostMeshDevice``: the object host reference models receive as ``mesh_device``.

It stands where a ``ttnn.MeshDevice`` stands: it has a shape, splits into sub-meshes (lanes)
and keeps the traces captured at warmup. Replaying a shape that warmup did not capture is an
error, as it is on hardware.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable

from vllm_tt_platform.mesh import MeshShape


class TraceNotCapturedError(RuntimeError):
    """A program was replayed with a shape no warmup captured a trace for."""


class HostMeshDevice:
    def __init__(self, shape: MeshShape, *, lane: int | None = None) -> None:
        self.mesh_shape = shape
        self.lane = lane
        self._traces: set[Hashable] = set()
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
        self._submeshes = [HostMeshDevice(sub, lane=i) for i in range(lanes)]
        return list(self._submeshes)

    # Traces.
    def capture_trace(self, key: Hashable) -> None:
        with self._lock:
            self._traces.add(key)

    def replay_trace(self, key: Hashable) -> None:
        with self._lock:
            if key not in self._traces:
                captured = ", ".join(sorted(map(str, self._traces))) or "none"
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
        self._traces.clear()
        self.closed = True
