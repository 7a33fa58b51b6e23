"""The host mesh backend, registered as ``host`` in the ``vllm_tt.mesh_backends`` entry points:
emulates any mesh shape on the CPU, optionally with modelled device time."""

from __future__ import annotations

from typing import Any

from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.cost.device_time import parse_device_time
from vllm_tt_platform.mesh.shape import MeshRequest

from vllm_tt_host import envs
from vllm_tt_host.device import HostDeviceOptions, HostMeshDevice
from vllm_tt_host.fault_loader import load_faults
from vllm_tt_host.options import HostOptions


class HostMeshBackend:
    """Opens a ``HostMeshDevice`` of the requested shape, with the ``tt.host_*`` options and the
    fault injector ``TT_HOST_FAULTS`` names (tests only)."""

    name = "host"
    options = HostOptions

    def __init__(self, config: TTConfig | None = None) -> None:
        self.config = config or TTConfig(mesh_backend="host")

    def available_devices(self) -> int:
        return 1 << 16

    def open(self, request: MeshRequest) -> Any:
        host = HostOptions.of(self.config)
        spec = host.host_device_time
        options = HostDeviceOptions(
            device_time=parse_device_time(spec) if spec else None,
            skip_math=host.host_skip_math,
            preset=request.preset,
        )
        device = HostMeshDevice(request.shape, options=options)
        injector = envs.TT_HOST_FAULTS.read()
        if injector:
            device.faults = load_faults(injector)
        return device

    def close(self, mesh_device: Any) -> None:
        mesh_device.close()
