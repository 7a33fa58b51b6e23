"""The real device path (``mesh_backend=ttnn``): open and close a Tenstorrent mesh with ttnn.

Every ttnn name used here is listed in :data:`TTNN_SURFACE`. The tests check that list against
the installed ttnn and replay open/close against a recorder that offers only those names, so a
ttnn upgrade that renames something fails in CI rather than on a customer's Galaxy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from vllm.logger import init_logger

from vllm_tt_platform.errors import TTConfigError, TTDeviceNotFoundError
from vllm_tt_platform.mesh.shape import MeshRequest, MeshShape, preset_name

logger = init_logger("vllm." + __name__)

TTNN_SURFACE: dict[str, tuple[str, ...]] = {
    "get_num_devices": (),
    "cluster.get_cluster_type": (),
    "cluster.ClusterType.GALAXY": (),
    "cluster.ClusterType.TG": (),
    "cluster.ClusterType.BLACKHOLE_GALAXY": (),
    "FabricConfig": (),
    "FabricConfig.DISABLED": (),
    "FabricConfig.FABRIC_1D": (),
    "FabricConfig.FABRIC_1D_RING": (),
    "FabricConfig.FABRIC_2D_TORUS_XY": (),
    "FabricReliabilityMode": (),
    "set_fabric_config": ("reliability_mode",),
    "MeshShape": (),
    "DispatchCoreAxis.ROW": (),
    "DispatchCoreAxis.COL": (),
    "DispatchCoreConfig": ("axis",),
    "open_mesh_device": ("mesh_shape", "dispatch_core_config", "trace_region_size", "worker_l1_size", "l1_small_size",
                         "physical_device_ids"),
    "MeshDevice.get_submeshes": (),
    "close_mesh_device": (),
}
"""Each ttnn attribute path this module reads, with the keyword arguments it passes to it.
``FabricConfig`` and ``FabricReliabilityMode`` members are also looked up by the names that
``TTConfig`` validated against the installed ttnn."""

class TtnnOptions(Protocol):
    """The options of ``config.options.TTConfig`` that opening a ttnn mesh reads (a protocol,
    so the mesh seam does not import ``config``)."""

    @property
    def fabric_config(self) -> str | None: ...
    @property
    def fabric_reliability_mode(self) -> str: ...
    @property
    def dispatch_core_axis(self) -> str | None: ...
    @property
    def trace_mode(self) -> str: ...
    @property
    def trace_region_size(self) -> int: ...
    @property
    def worker_l1_size(self) -> int | None: ...
    @property
    def l1_small_size(self) -> int | None: ...


HOST_BACKEND_HINT = (
    "To run without a Tenstorrent device, install the vllm-tt-host distribution and use the host "
    "mesh backend: --additional-config.tt.mesh_backend host or TT_MESH_BACKEND=host."
)

FABRIC_OFF = "DISABLED"
MULTI_CHIP_FABRIC = "FABRIC_1D"
CLUSTER_FABRIC: dict[str, str] = {
    "GALAXY": "FABRIC_1D_RING",
    "TG": "FABRIC_1D_RING",
    "BLACKHOLE_GALAXY": "FABRIC_2D_TORUS_XY",
}
"""Default fabric by ``ttnn.cluster.ClusterType`` name; other multi-chip clusters get FABRIC_1D."""

PRESET_CLUSTER: dict[str, str] = {"TG": "GALAXY", "BH-Galaxy": "BLACKHOLE_GALAXY"}
"""``MESH_DEVICE`` presets that already say which cluster this is, so ttnn need not be asked."""

DISPATCH_AXES: dict[str, str] = {"row": "ROW", "col": "COL"}


@dataclass(frozen=True)
class FabricChoice:
    """The fabric set before opening, and why (for the startup log)."""

    name: str | None
    """A ``ttnn.FabricConfig`` member name; ``None`` leaves the fabric untouched."""
    reason: str


@dataclass(frozen=True)
class MeshOpenPlan:
    """Everything :meth:`TtnnMeshBackend.open` passes to ttnn, decided before any call that
    changes device state, so it can be logged once and tested without a device."""

    shape: MeshShape
    fabric: FabricChoice
    reliability_mode: str
    dispatch_core_axis: str | None
    trace_region_size: int | None
    worker_l1_size: int | None
    l1_small_size: int | None
    physical_device_ids: tuple[int, ...] | None = None
    """This engine's devices when it owns part of the host (a data-parallel rank's sub-mesh)."""

    def describe(self) -> str:
        def sized(value: int | None) -> str:
            return "ttnn default" if value is None else f"{value} bytes"

        fabric = f"{self.fabric.name} ({self.reliability_mode})" if self.fabric.name else "off"
        return (
            f"mesh {self.shape}, fabric {fabric} because {self.fabric.reason}, "
            f"dispatch axis {self.dispatch_core_axis or 'ttnn default'}, "
            f"trace region {'off' if self.trace_region_size is None else sized(self.trace_region_size)}, "
            f"worker L1 {sized(self.worker_l1_size)}, L1 small {sized(self.l1_small_size)}"
            + (f", devices {list(self.physical_device_ids)}" if self.physical_device_ids else "")
        )


def choose_fabric(config: TtnnOptions, request: MeshRequest, cluster_type: Callable[[], str]) -> FabricChoice:
    """The user's ``fabric_config`` if set, else a default for the cluster; ``cluster_type``
    (a ``ClusterType`` name) is only asked for a multi-chip mesh without a Galaxy preset."""
    if config.fabric_config is not None:
        name = None if config.fabric_config == FABRIC_OFF else config.fabric_config
        return FabricChoice(name, f"fabric_config={config.fabric_config} was set")
    if request.shape.num_devices == 1:
        return FabricChoice(None, "a single-chip mesh needs no fabric")
    preset = _canonical_preset(request.preset)
    if preset in PRESET_CLUSTER:
        cluster, source = PRESET_CLUSTER[preset], f"MESH_DEVICE={preset}"
    else:
        cluster, source = cluster_type(), "ttnn.cluster.get_cluster_type()"
    name = CLUSTER_FABRIC.get(cluster, MULTI_CHIP_FABRIC)
    return FabricChoice(name, f"the default for a multi-chip {cluster} cluster (from {source})")


def plan_open(config: TtnnOptions, request: MeshRequest, cluster_type: Callable[[], str]) -> MeshOpenPlan:
    return MeshOpenPlan(
        shape=request.shape,
        fabric=choose_fabric(config, request, cluster_type),
        reliability_mode=config.fabric_reliability_mode,
        dispatch_core_axis=config.dispatch_core_axis,
        trace_region_size=None if config.trace_mode == "none" else config.trace_region_size,
        worker_l1_size=config.worker_l1_size,
        l1_small_size=config.l1_small_size,
        physical_device_ids=request.device_ids,
    )


class TtnnMeshBackend:
    """Opens the mesh on real Tenstorrent hardware; fails fast with a hint when there is none."""

    name = "ttnn"

    def __init__(self, config: TtnnOptions) -> None:
        self._config = config
        self._ttnn = _import_ttnn()
        self._fabric_set = False

    def available_devices(self) -> int:
        """ttnn's device count; raises :class:`TTDeviceNotFoundError` when ttnn cannot even
        count (on a machine without a device ttnn 0.81 raises instead of returning 0)."""
        try:
            count = self._ttnn.get_num_devices()
        except Exception as exc:
            raise TTDeviceNotFoundError(
                f"No Tenstorrent device was found: ttnn.get_num_devices() failed with "
                f"{type(exc).__name__}: {_headline(exc)}. {HOST_BACKEND_HINT}"
            ) from exc
        return int(count)

    def open(self, request: MeshRequest) -> Any:
        """Check the mesh fits, set the fabric, open; the fabric is reset if opening fails."""
        self._check_fits(request)
        plan = plan_open(self._config, request, self._cluster_type)
        logger.info("Opening ttnn %s (requested by %s).", plan.describe(), request.source)
        kwargs = self._open_kwargs(plan)
        try:
            self._set_fabric(plan)
            return self._ttnn.open_mesh_device(**kwargs)
        except BaseException:
            self._reset_fabric_after_failure()
            raise

    def close(self, mesh_device: Any) -> None:
        """Submeshes first, then the parent, then the fabric (even if a close failed)."""
        try:
            for submesh in mesh_device.get_submeshes():
                self._ttnn.close_mesh_device(submesh)
            self._ttnn.close_mesh_device(mesh_device)
        finally:
            self._reset_fabric()

    def _check_fits(self, request: MeshRequest) -> None:
        available = self.available_devices()
        if available == 0:
            raise TTDeviceNotFoundError(
                f"No Tenstorrent device was found: ttnn.get_num_devices() reports 0 devices. {HOST_BACKEND_HINT}"
            )
        needed = request.shape.num_devices
        if needed > available:
            raise TTConfigError(
                "MESH_DEVICE",
                request.preset or str(request.shape),
                f"a mesh of at most {available} devices (mesh {request.shape} from {request.source} "
                f"needs {needed}, ttnn found {available})",
                f"set MESH_DEVICE to a shape that fits, e.g. (1,{available})",
            )
        beyond = [i for i in request.device_ids or () if i >= available]
        if beyond:
            raise TTConfigError(
                "TT_VISIBLE_DEVICES", ",".join(map(str, request.device_ids or ())),
                f"device ids below {available} (ttnn found {available} devices; {request.source})",
                "list this host's device ids in TT_VISIBLE_DEVICES, or unset it",
            )

    def _cluster_type(self) -> str:
        return str(self._ttnn.cluster.get_cluster_type().name)

    def _set_fabric(self, plan: MeshOpenPlan) -> None:
        if plan.fabric.name is None:
            return
        self._fabric_set = True
        self._ttnn.set_fabric_config(
            self._ttnn.FabricConfig[plan.fabric.name],
            reliability_mode=self._ttnn.FabricReliabilityMode[plan.reliability_mode],
        )

    def _reset_fabric(self) -> None:
        if self._fabric_set:
            self._fabric_set = False
            self._ttnn.set_fabric_config(self._ttnn.FabricConfig.DISABLED)

    def _reset_fabric_after_failure(self) -> None:
        """Reset without hiding the error that made opening fail."""
        try:
            self._reset_fabric()
        except Exception:
            logger.exception("Resetting the ttnn fabric after a failed open also failed.")

    def _open_kwargs(self, plan: MeshOpenPlan) -> dict[str, Any]:
        ttnn = self._ttnn
        axis = None if plan.dispatch_core_axis is None else ttnn.DispatchCoreAxis[DISPATCH_AXES[plan.dispatch_core_axis]]
        kwargs: dict[str, Any] = {
            "mesh_shape": ttnn.MeshShape(plan.shape.rows, plan.shape.cols),
            "dispatch_core_config": ttnn.DispatchCoreConfig(axis=axis),
        }
        optional = {
            "trace_region_size": plan.trace_region_size,
            "worker_l1_size": plan.worker_l1_size,
            "l1_small_size": plan.l1_small_size,
            "physical_device_ids": list(plan.physical_device_ids) if plan.physical_device_ids else None,
        }
        kwargs.update({key: value for key, value in optional.items() if value is not None})
        return kwargs


def _import_ttnn() -> Any:
    try:
        import ttnn
    except ImportError as exc:
        raise TTDeviceNotFoundError(
            f"mesh_backend=ttnn needs the ttnn package, which does not import here ({exc}); "
            f"install it with pip install 'vllm-tt-platform[ttnn]'. {HOST_BACKEND_HINT}"
        ) from exc
    return ttnn


def _canonical_preset(preset: str | None) -> str | None:
    if preset is None:
        return None
    return preset_name(preset) or preset


def _headline(exc: BaseException) -> str:
    """ttnn errors carry a C++ backtrace; keep the text before it."""
    text = str(exc).split("backtrace:")[0]
    return " ".join(line.strip() for line in text.splitlines() if line.strip() and line.strip() != "info:")
