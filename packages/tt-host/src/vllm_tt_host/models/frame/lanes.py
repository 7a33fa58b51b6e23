"""``LaneLayout``: how the global decode batch splits into lanes.

A lane is a data-parallel sub-mesh with its own KV cache. Global slot ``s`` belongs to lane
``s // rows_per_lane``; decode row ``r`` is slot ``r``, prefill rows name their slot. The lanes'
sub-meshes run side by side, so a program over all of them takes as long as its busiest lane.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from vllm_tt_platform.cost.device_time import ProgramCosts
from vllm_tt_platform.errors import TTConfigError

from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.frame.shapes import HostModelInputError

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.inputs import PrefillRow


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

    def prefill_s(self, costs: ProgramCosts, rows: Iterable[PrefillRow]) -> float:
        """One prefill call: each lane runs its own rows one after another on its sub-mesh
        (``costs`` are one sub-mesh's), the lanes side by side: the busiest lane's time."""
        per_lane = [0.0] * self.count
        for row in rows:
            per_lane[row.lane] += costs.prefill_s(row.end - row.start, row.start)
        return max(per_lane)

    def decode_s(self, costs: ProgramCosts, positions: torch.Tensor) -> float:
        """One decode step over the whole batch (``positions``: one per row, -1 = padding):
        every sub-mesh reads its own weights and its lane's KV, side by side."""
        context = (positions + 1).clamp(min=0).reshape(self.count, self.rows_per_lane).sum(dim=1)
        return max(costs.decode_s(int(tokens)) for tokens in context.tolist())

    def mixed_s(self, costs: ProgramCosts, positions: torch.Tensor, chunk: PrefillRow) -> float:
        """One mixed step: the chunk's lane runs its decode rows and the chunk in one program
        (``ProgramCosts.mixed_s``), the other lanes a decode step, side by side."""
        context = (positions + 1).clamp(min=0).reshape(self.count, self.rows_per_lane)
        live = (positions >= 0).reshape(self.count, self.rows_per_lane).sum(dim=1).tolist()
        per_lane = [
            costs.mixed_s(int(tokens), live[lane], [(chunk.end - chunk.start, chunk.start)]) if lane == chunk.lane
            else costs.decode_s(int(tokens))
            for lane, tokens in enumerate(context.sum(dim=1).tolist())
        ]
        return max(per_lane)

    def verify_s(self, costs: ProgramCosts, start: torch.Tensor, valid: torch.Tensor) -> float:
        """One verify step: row ``r`` computes ``valid[r]`` positions from ``start[r]`` (-1 =
        padding), each lane on its own sub-mesh, side by side."""
        live = start >= 0
        context = torch.where(live, start + valid, 0).reshape(self.count, self.rows_per_lane).sum(dim=1)
        queries = torch.where(live, valid, 0).reshape(self.count, self.rows_per_lane).sum(dim=1)
        return max(costs.verify_s(int(c), int(q)) for c, q in zip(context.tolist(), queries.tolist(), strict=True))
