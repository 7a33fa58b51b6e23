"""``LaneLayout``: how the global decode batch splits into lanes.

A lane is a data-parallel sub-mesh with its own KV cache. Global slot ``s`` belongs to lane
``s // rows_per_lane``; decode row ``r`` is slot ``r``, prefill rows name their slot.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.host.device import HostMeshDevice
from vllm_tt_platform.host.models.shapes import HostModelInputError


@dataclass(frozen=True)
class LaneLayout:
    devices: tuple[HostMeshDevice, ...]
    """One (sub-)mesh per lane; traces are captured and replayed per lane."""
    rows_per_lane: int

    @property
    def count(self) -> int:
        return len(self.devices)

    @property
    def max_batch_size(self) -> int:
        return self.count * self.rows_per_lane

    @classmethod
    def build(cls, mesh_device: HostMeshDevice, max_batch_size: int, tt_data_parallel: int) -> LaneLayout:
        """Split ``mesh_device`` into ``tt_data_parallel`` lanes of equal batch."""
        if (
            isinstance(tt_data_parallel, bool)
            or not isinstance(tt_data_parallel, int)
            or tt_data_parallel < 1
        ):
            raise TTConfigError("tt_data_parallel", tt_data_parallel, "a positive int", "pass the lane count")
        if max_batch_size < 1 or max_batch_size % tt_data_parallel:
            raise TTConfigError(
                "max_batch_size",
                max_batch_size,
                f"a positive multiple of tt_data_parallel={tt_data_parallel}",
                "give every lane the same number of decode rows",
            )
        if tt_data_parallel == 1:
            devices: tuple[HostMeshDevice, ...] = (mesh_device,)
        else:
            devices = tuple(mesh_device.create_submeshes(tt_data_parallel))
        return cls(devices=devices, rows_per_lane=max_batch_size // tt_data_parallel)

    def lane_of(self, slot: int) -> int:
        if not 0 <= slot < self.max_batch_size:
            raise HostModelInputError(
                f"slot {slot} is outside the decode batch 0..{self.max_batch_size - 1} "
                f"({self.count} lanes x {self.rows_per_lane} rows)"
            )
        return slot // self.rows_per_lane

    def rows(self, lane: int) -> range:
        """The global slots (decode rows) of ``lane``."""
        return range(lane * self.rows_per_lane, (lane + 1) * self.rows_per_lane)
