"""The mesh seam: the one place that knows whether a real ttnn mesh or the host emulation
runs the model programs. Nothing above it asks which one it has."""

from __future__ import annotations

from typing import Any, Protocol

from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.mesh.shape import MeshRequest


class MeshBackend(Protocol):
    name: str

    def available_devices(self) -> int:
        """How many devices this backend can open, checked before opening."""
        ...

    def open(self, request: MeshRequest) -> Any:
        """Open the mesh; the result is what models receive as ``mesh_device``."""
        ...

    def close(self, mesh_device: Any) -> None: ...


class HostMeshBackend:
    """Emulates any mesh shape on the CPU, optionally with modelled device time."""

    name = "host"

    def __init__(self, config: TTConfig | None = None) -> None:
        self.config = config or TTConfig(mesh_backend="host")

    def available_devices(self) -> int:
        return 1 << 16

    def open(self, request: MeshRequest) -> Any:
        from vllm_tt_platform import envs
        from vllm_tt_platform.host.device import HostDeviceOptions, HostMeshDevice, load_faults
        from vllm_tt_platform.host.device_time import parse_device_time

        spec = self.config.host_device_time
        options = HostDeviceOptions(
            device_time=parse_device_time(spec) if spec else None,
            skip_math=self.config.host_skip_math,
            preset=request.preset,
        )
        device = HostMeshDevice(request.shape, options=options)
        injector = envs.TT_HOST_FAULTS.read()
        if injector:
            device.faults = load_faults(injector)
        return device

    def close(self, mesh_device: Any) -> None:
        mesh_device.close()


def make_backend(config: TTConfig) -> MeshBackend:
    if config.mesh_backend == "host":
        return HostMeshBackend(config)
    from vllm_tt_platform.mesh.ttnn_mesh import TtnnMeshBackend

    return TtnnMeshBackend(config)
