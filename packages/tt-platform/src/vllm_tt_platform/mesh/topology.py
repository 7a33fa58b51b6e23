"""Where the model runs: mesh shape (from ``MESH_DEVICE``) and the number of in-process lanes."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_tt_platform.mesh.shape import MeshRequest


@dataclass(frozen=True)
class Topology:
    mesh: MeshRequest
    lanes: int
    """In-process data-parallel lanes (1 unless the model declares single_program_lanes and
    ``--data-parallel-size`` > 1)."""
    rows_per_lane: int
    """Decode rows per lane (``--max-num-seqs``)."""

    @property
    def decode_rows(self) -> int:
        """The fixed decode batch sent to the model every decode step."""
        return self.lanes * self.rows_per_lane

    def describe(self) -> str:
        lane_text = (
            f"{self.lanes} lanes x {self.rows_per_lane} rows on sub-meshes {self.mesh.shape.split(self.lanes)}"
            if self.lanes > 1 else f"1 lane x {self.rows_per_lane} rows"
        )
        return f"mesh {self.mesh.shape} ({self.mesh.source}), {lane_text}"
