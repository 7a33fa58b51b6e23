"""Where the model runs: mesh shape (from ``MESH_DEVICE``) and the number of in-process lanes."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_tt_platform.backend import MeshRequest
from vllm_tt_platform.mesh import MESH_PRESETS, MeshShape, parse_mesh_device


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


def mesh_request(environ: Mapping[str, str] | None = None) -> MeshRequest:
    environ = os.environ if environ is None else environ
    raw = environ.get("MESH_DEVICE", "").strip()
    if not raw:
        return MeshRequest(MeshShape(1, 1), "default: MESH_DEVICE unset", None)
    shape = parse_mesh_device(raw)
    preset = next((name for name in MESH_PRESETS if name.upper() == raw.upper()), None)
    return MeshRequest(shape, f"MESH_DEVICE={raw}", preset)
