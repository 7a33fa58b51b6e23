"""The mesh seam: the one place that knows which backend runs the model programs. Nothing above
it asks which one it has.

Backends are found by name in the entry-point group ``vllm_tt.mesh_backends``: the platform
registers ``ttnn`` (a real Tenstorrent mesh), the ``vllm-tt-host`` distribution registers
``host`` (the CPU emulation). The platform never imports a backend it does not ship.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from importlib import metadata
from typing import Any, Protocol

from vllm_tt_platform.errors import TTMeshBackendNotInstalledError
from vllm_tt_platform.mesh.shape import MeshRequest

MESH_BACKENDS_GROUP = "vllm_tt.mesh_backends"
PROVIDERS: dict[str, str] = {"ttnn": "vllm-tt-platform", "host": "vllm-tt-host"}
"""Which distribution registers each backend the docs name (for the error when it is missing)."""


class MeshBackend(Protocol):
    name: str

    def available_devices(self) -> int:
        """How many devices this backend can open, checked before opening."""
        ...

    def open(self, request: MeshRequest) -> Any:
        """Open the mesh; the result is what models receive as ``mesh_device``."""
        ...

    def close(self, mesh_device: Any) -> None: ...


class BackendFactory(Protocol):
    """What a ``vllm_tt.mesh_backends`` entry point names: called with the engine's ``TTConfig``
    (typed ``Any`` here so the seam does not import ``config``). It may carry ``options``, a
    dataclass of the extra ``--additional-config.tt`` keys the backend accepts (fields declared
    with ``config.options.option`` metadata); ``TTConfig`` parses them and keeps the chosen
    backend's in ``backend_options``."""

    def __call__(self, config: Any) -> MeshBackend: ...


@functools.cache
def option_tables() -> dict[str, type]:
    """Each installed backend's own option table, by backend name (read once per process)."""
    tables = {}
    for ep in metadata.entry_points(group=MESH_BACKENDS_GROUP):
        table = getattr(ep.load(), "options", None)
        if table is not None:
            tables[ep.name] = table
    return tables


def find_backend(name: str, eps: Iterable[metadata.EntryPoint] | None = None) -> metadata.EntryPoint:
    """The entry point registering backend ``name`` (nothing imported yet); raises
    ``TTMeshBackendNotInstalledError`` naming the distribution to install."""
    found = metadata.entry_points(group=MESH_BACKENDS_GROUP) if eps is None else eps
    matches = [ep for ep in found if ep.name == name]
    if not matches:
        installed = sorted({ep.name for ep in found})
        raise TTMeshBackendNotInstalledError(name, PROVIDERS.get(name), installed)
    return matches[0]


def make_backend(config: Any, eps: Iterable[metadata.EntryPoint] | None = None) -> MeshBackend:
    """The backend ``config.mesh_backend`` names, built from its entry point."""
    factory: BackendFactory = find_backend(config.mesh_backend, eps).load()
    return factory(config)
