"""Mesh shapes: ``MESH_DEVICE`` presets and literal shapes, how a mesh splits into lanes, and
the ``MeshRequest`` a worker makes of a backend. The one place presets are looked up.

Convention, used everywhere in vllm-tt: a shape is ``(rows, cols)`` and a Galaxy is ``(8, 4)``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_tt_platform.envs import MESH_DEVICE, TT_VISIBLE_DEVICES
from vllm_tt_platform.errors import TTConfigError


@dataclass(frozen=True)
class MeshShape:
    rows: int
    cols: int

    @property
    def num_devices(self) -> int:
        return self.rows * self.cols

    def split(self, lanes: int) -> MeshShape:
        """Shape of one of ``lanes`` equal sub-meshes: whole rows when the rows divide evenly,
        else a ``(1, n)`` strip."""
        if lanes < 1 or self.num_devices % lanes:
            raise TTConfigError(
                "data_parallel_size",
                lanes,
                f"a divisor of the {self.num_devices} devices of mesh {self}",
                "choose a --data-parallel-size that divides the mesh",
            )
        if self.rows % lanes == 0:
            return MeshShape(self.rows // lanes, self.cols)
        return MeshShape(1, self.num_devices // lanes)

    def __str__(self) -> str:
        return f"({self.rows},{self.cols})"


MESH_PRESETS: dict[str, MeshShape] = {
    "N150": MeshShape(1, 1),
    "N300": MeshShape(1, 2),
    "N150x4": MeshShape(1, 4),
    "T3K": MeshShape(1, 8),
    "TG": MeshShape(8, 4),
    "P100": MeshShape(1, 1),
    "P150": MeshShape(1, 1),
    "P150x2": MeshShape(1, 2),
    "P300": MeshShape(1, 2),
    "P150x4": MeshShape(1, 4),
    "P300x2": MeshShape(1, 4),
    "P150x8": MeshShape(1, 8),
    "BH-Galaxy": MeshShape(8, 4),
}
"""Named systems and their mesh shapes, ``(rows, cols)``."""

GALAXY_PRESETS = frozenset({"TG", "BH-Galaxy"})


def preset_name(text: str) -> str | None:
    """The ``MESH_PRESETS`` name ``text`` spells (case-insensitive), or None."""
    wanted = text.strip().upper()
    return next((name for name in MESH_PRESETS if name.upper() == wanted), None)


def parse_mesh_device(value: str) -> MeshShape:
    """Parse ``MESH_DEVICE``: a preset name (case-insensitive) or ``"(r,c)"`` / ``"[r,c]"``."""
    text = value.strip()
    preset = preset_name(text)
    if preset is not None:
        return MESH_PRESETS[preset]
    if text[:1] in "([":
        try:
            parsed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            parsed = None
        if (
            isinstance(parsed, (tuple, list))
            and len(parsed) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in parsed)
        ):
            return MeshShape(parsed[0], parsed[1])
    raise TTConfigError(
        "MESH_DEVICE",
        value,
        f"one of {', '.join(MESH_PRESETS)} or a shape like \"(1,8)\"",
        "set MESH_DEVICE to a preset name or a (rows,cols) shape of positive ints",
    )


@dataclass(frozen=True)
class MeshRequest:
    """What the worker asks of a backend: the mesh shape and where it came from."""

    shape: MeshShape
    source: str
    """How the shape was chosen, for the startup log (e.g. ``MESH_DEVICE=TG``)."""
    preset: str | None = None
    """The ``MESH_DEVICE`` preset name, when one was used (fabric defaults depend on it)."""
    device_ids: tuple[int, ...] | None = None
    """Physical devices to open (``ttnn.open_mesh_device(physical_device_ids=...)``); None: all."""

    def sub_mesh(self, index: int, count: int, who: str,
                 environ: Mapping[str, str] | None = None) -> MeshRequest:
        """The ``index``-th of ``count`` equal sub-meshes, with the devices it owns: the
        ``TT_VISIBLE_DEVICES`` list (else ``0..n-1``) cut into ``count`` consecutive runs."""
        shape = self.shape.split(count)
        visible = TT_VISIBLE_DEVICES.read(environ) or tuple(range(self.shape.num_devices))
        if len(visible) != self.shape.num_devices:
            raise TTConfigError(
                "TT_VISIBLE_DEVICES", ",".join(map(str, visible)),
                f"{self.shape.num_devices} device ids, one per device of the mesh {self.shape} ({self.source})",
                "list exactly the host's devices the mesh is made of, or unset it",
            )
        if not 0 <= index < count:
            raise TTConfigError("data_parallel_rank_local", index, f"0..{count - 1}", "check --data-parallel-size-local")
        size = shape.num_devices
        ids = visible[index * size : (index + 1) * size]
        return MeshRequest(shape, f"{self.source}, {who}: sub-mesh {shape}, devices {list(ids)}", None, ids)


def mesh_request(environ: Mapping[str, str] | None = None) -> MeshRequest:
    """The mesh ``MESH_DEVICE`` asks for (one device when unset)."""
    raw = MESH_DEVICE.read(environ)
    if not raw:
        return MeshRequest(MeshShape(1, 1), "default: MESH_DEVICE unset", None)
    return MeshRequest(parse_mesh_device(raw), f"MESH_DEVICE={raw}", preset_name(raw))
