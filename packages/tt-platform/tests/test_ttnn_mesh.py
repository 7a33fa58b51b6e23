"""The ttnn mesh backend: its ttnn names checked against the installed ttnn, its open/close
call sequences replayed against a recorder bound to the real signatures, and a real no-device run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import ttnn
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.errors import TTConfigError, TTDeviceNotFoundError
from vllm_tt_platform.mesh.backend import make_backend
from vllm_tt_platform.mesh.shape import GALAXY_PRESETS, MESH_PRESETS, MeshRequest, MeshShape
from vllm_tt_platform.mesh.ttnn_mesh import (
    CLUSTER_FABRIC,
    DISPATCH_AXES,
    FABRIC_OFF,
    MULTI_CHIP_FABRIC,
    PRESET_CLUSTER,
    TTNN_SURFACE,
    TtnnMeshBackend,
    plan_open,
)


def _load_recorder() -> Any:
    """The suite runs with ``--import-mode=importlib`` and this folder is not a package, so the
    helper next to this file is loaded by path."""
    spec = importlib.util.spec_from_file_location("vllm_tt_platform_tests_ttnn_recorder",
                                                  Path(__file__).with_name("ttnn_recorder.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_recorder = _load_recorder()
FakeCluster, Recorder, surface_problems = _recorder.FakeCluster, _recorder.Recorder, _recorder.surface_problems

HOST_HINTS = ("vllm-tt-host", "--additional-config.tt.mesh_backend host", "TT_MESH_BACKEND=host")
TRACE = TTConfig().trace_region_size
CONSTRUCTORS = ("MeshShape", "DispatchCoreConfig")

Calls = list[tuple[str, dict[str, Any]]]


def preset(name: str) -> MeshRequest:
    return MeshRequest(MESH_PRESETS[name], f"MESH_DEVICE={name}", preset=name)


def recorder(monkeypatch: pytest.MonkeyPatch, cluster: Any) -> Any:
    rec = Recorder(ttnn, TTNN_SURFACE, cluster)
    monkeypatch.setitem(sys.modules, "ttnn", rec.module())
    return rec


def open_close(monkeypatch: pytest.MonkeyPatch, cluster: Any, request: MeshRequest,
               with_constructors: bool = False, **config: Any) -> Calls:
    rec = recorder(monkeypatch, cluster)
    backend = TtnnMeshBackend(TTConfig(**config))
    backend.close(backend.open(request))
    return rec.calls if with_constructors else [c for c in rec.calls if c[0] not in CONSTRUCTORS]


def opened(shape: str, trace: int | None = TRACE, axis: str = "None", **extra: Any) -> tuple[str, dict[str, Any]]:
    args: dict[str, Any] = {"mesh_shape": f"MeshShape({shape})", "dispatch_core_config": f"DispatchCoreConfig(axis={axis})"}
    if trace is not None:
        args["trace_region_size"] = trace
    return ("open_mesh_device", {**args, **extra})


COUNT = ("get_num_devices", {})
CLUSTER = ("cluster.get_cluster_type", {})
SUBMESHES = ("MeshDevice.get_submeshes", {"self": "mesh"})
CLOSE = ("close_mesh_device", {"mesh_device": "mesh"})
FABRIC_RESET = ("set_fabric_config", {"config": "DISABLED"})


def fabric(name: str, mode: str = "STRICT_INIT") -> tuple[str, dict[str, Any]]:
    return ("set_fabric_config", {"config": name, "reliability_mode": mode})


# 1. The surface against the installed ttnn.

def test_every_surface_name_and_keyword_exists_in_installed_ttnn() -> None:
    assert surface_problems(ttnn, TTNN_SURFACE) == []


def test_surface_check_reports_misspellings() -> None:
    misspelled = {
        "open_mesh_devic": (),
        "FabricConfig.FABRIC_1D_RINGG": (),
        "open_mesh_device": ("trace_region_sise",),
        "set_fabric_config": ("reliabilty_mode",),
        "DispatchCoreConfig": ("axes",),
    }
    problems = surface_problems(ttnn, misspelled)
    assert len(problems) == 5
    for wrong in ("open_mesh_devic", "FABRIC_1D_RINGG", "trace_region_sise", "reliabilty_mode", "axes"):
        assert any(wrong in p for p in problems), wrong


def test_name_tables_only_use_surface_names() -> None:
    fabrics = {FABRIC_OFF, MULTI_CHIP_FABRIC, *CLUSTER_FABRIC.values()}
    assert {f"FabricConfig.{name}" for name in fabrics} <= set(TTNN_SURFACE)
    assert {f"cluster.ClusterType.{name}" for name in {*CLUSTER_FABRIC, *PRESET_CLUSTER.values()}} <= set(TTNN_SURFACE)
    assert {f"DispatchCoreAxis.{name}" for name in DISPATCH_AXES.values()} <= set(TTNN_SURFACE)
    assert set(PRESET_CLUSTER) == GALAXY_PRESETS


def test_recorder_rejects_keywords_missing_from_surface_and_wrong_types(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = recorder(monkeypatch, FakeCluster()).module()
    with pytest.raises(TypeError, match="missing from TTNN_SURFACE"):
        fake.open_mesh_device(num_command_queues=1)
    with pytest.raises(TypeError, match="matches no real signature"):
        fake.open_mesh_device(mesh_shape=(1, 2))
    with pytest.raises(TypeError, match="matches no real signature"):
        fake.set_fabric_config("FABRIC_1D")
    assert not hasattr(fake, "open_device")


# 2. Call sequences.

def test_single_chip_opens_without_fabric_or_cluster_query(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=1), preset("N150"))
    assert calls == [COUNT, opened("[1, 1]"), SUBMESHES, CLOSE]


@pytest.mark.parametrize(("name", "cluster_type", "devices"), [("N300", "N300", 2), ("T3K", "T3K", 8)])
def test_multi_chip_sets_fabric_1d_from_cluster_type(monkeypatch: pytest.MonkeyPatch, name: str,
                                                    cluster_type: str, devices: int) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=devices, cluster_type=cluster_type), preset(name))
    shape = MESH_PRESETS[name]
    assert calls == [COUNT, CLUSTER, fabric("FABRIC_1D"), opened(f"[{shape.rows}, {shape.cols}]"),
                     SUBMESHES, CLOSE, FABRIC_RESET]


def test_tg_preset_sets_ring_and_closes_submeshes_before_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=32, cluster_type="GALAXY", submeshes=2), preset("TG"))
    assert calls == [
        COUNT,
        fabric("FABRIC_1D_RING"),
        opened("[8, 4]"),
        SUBMESHES,
        ("close_mesh_device", {"mesh_device": "submesh0"}),
        ("close_mesh_device", {"mesh_device": "submesh1"}),
        CLOSE,
        FABRIC_RESET,
    ]


def test_bh_galaxy_preset_sets_2d_torus(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=32, cluster_type="BLACKHOLE_GALAXY"), preset("BH-Galaxy"))
    assert calls == [COUNT, fabric("FABRIC_2D_TORUS_XY"), opened("[8, 4]"), SUBMESHES, CLOSE, FABRIC_RESET]


def test_preset_name_is_matched_case_insensitively(monkeypatch: pytest.MonkeyPatch) -> None:
    request = MeshRequest(MeshShape(8, 4), "MESH_DEVICE=tg", preset="tg")
    calls = open_close(monkeypatch, FakeCluster(devices=32, cluster_type="GALAXY"), request)
    assert calls[:3] == [COUNT, fabric("FABRIC_1D_RING"), opened("[8, 4]")]


@pytest.mark.parametrize(("cluster_type", "expected"), [
    ("GALAXY", "FABRIC_1D_RING"),
    ("TG", "FABRIC_1D_RING"),
    ("BLACKHOLE_GALAXY", "FABRIC_2D_TORUS_XY"),
    ("P150_X4", "FABRIC_1D"),
])
def test_shape_without_preset_takes_fabric_from_cluster_query(monkeypatch: pytest.MonkeyPatch, cluster_type: str,
                                                             expected: str) -> None:
    request = MeshRequest(MeshShape(1, 4), "MESH_DEVICE=(1,4)")
    calls = open_close(monkeypatch, FakeCluster(devices=32, cluster_type=cluster_type), request)
    assert calls[:4] == [COUNT, CLUSTER, fabric(expected), opened("[1, 4]")]


def test_fabric_config_override_wins_and_passes_reliability_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=32, cluster_type="GALAXY"), preset("TG"),
                       fabric_config="FABRIC_2D", fabric_reliability_mode="RELAXED_INIT")
    assert calls == [COUNT, fabric("FABRIC_2D", "RELAXED_INIT"), opened("[8, 4]"), SUBMESHES, CLOSE, FABRIC_RESET]


def test_fabric_config_override_applies_to_a_single_chip(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=1), preset("N150"), fabric_config="FABRIC_1D")
    assert calls == [COUNT, fabric("FABRIC_1D"), opened("[1, 1]"), SUBMESHES, CLOSE, FABRIC_RESET]


def test_fabric_config_disabled_leaves_fabric_untouched(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=8, cluster_type="T3K"), preset("T3K"), fabric_config="DISABLED")
    assert calls == [COUNT, opened("[1, 8]"), SUBMESHES, CLOSE]


def test_trace_mode_none_opens_without_trace_region(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=1), preset("N150"), trace_mode="none")
    assert calls[1] == opened("[1, 1]", trace=None)


def test_trace_and_l1_sizes_are_passed_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=1), preset("N150"), trace_mode="decode_only",
                       trace_region_size=1234, worker_l1_size=1_000_000, l1_small_size=32768)
    assert calls[1] == opened("[1, 1]", trace=1234, worker_l1_size=1_000_000, l1_small_size=32768)


def test_a_data_parallel_ranks_sub_mesh_opens_its_own_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 of 2 dense DP ranks on a T3K opens the second (1,4) sub-mesh, devices 4..7."""
    host = preset("T3K")
    calls = open_close(monkeypatch, FakeCluster(devices=8, cluster_type="T3K"), host.sub_mesh(1, 2, "DP rank 1", {}))
    assert [c for c in calls if c[0] == "open_mesh_device"] == [opened("[1, 4]", physical_device_ids=[4, 5, 6, 7])]


def test_a_sub_mesh_takes_its_devices_from_tt_visible_devices() -> None:
    visible = {"TT_VISIBLE_DEVICES": "7,6,5,4,3,2,1,0"}
    assert preset("T3K").sub_mesh(0, 2, "DP rank 0", visible).device_ids == (7, 6, 5, 4)
    with pytest.raises(TTConfigError, match="TT_VISIBLE_DEVICES.*8 device ids"):
        preset("T3K").sub_mesh(0, 2, "DP rank 0", {"TT_VISIBLE_DEVICES": "0,1,2"})


def test_device_ids_beyond_the_host_are_refused_before_opening(monkeypatch: pytest.MonkeyPatch) -> None:
    request = MeshRequest(MESH_PRESETS["N300"], "test", device_ids=(2, 3))
    rec = recorder(monkeypatch, FakeCluster(devices=2))
    with pytest.raises(TTConfigError, match="TT_VISIBLE_DEVICES"):
        TtnnMeshBackend(TTConfig()).open(request)
    assert [c[0] for c in rec.calls] == ["get_num_devices"]


def test_dispatch_core_axis_col_full_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = open_close(monkeypatch, FakeCluster(devices=2, cluster_type="N300"), preset("N300"),
                       with_constructors=True, dispatch_core_axis="col")
    assert calls == [
        COUNT,
        CLUSTER,
        ("MeshShape", {"s0": 1, "s1": 2}),
        ("DispatchCoreConfig", {"axis": "COL"}),
        fabric("FABRIC_1D"),
        opened("[1, 2]", axis="COL"),
        SUBMESHES,
        CLOSE,
        FABRIC_RESET,
    ]


def test_failure_while_opening_resets_fabric_and_reraises(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder(monkeypatch, FakeCluster(devices=8, cluster_type="T3K", open_error=RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        TtnnMeshBackend(TTConfig()).open(preset("T3K"))
    assert [c for c in rec.calls if c[0] not in CONSTRUCTORS] == [
        COUNT, CLUSTER, fabric("FABRIC_1D"), opened("[1, 8]"), FABRIC_RESET]


def test_failure_while_closing_still_resets_fabric(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder(monkeypatch, FakeCluster(devices=8, cluster_type="T3K", close_error=RuntimeError("stuck")))
    backend = TtnnMeshBackend(TTConfig())
    mesh = backend.open(preset("T3K"))
    with pytest.raises(RuntimeError, match="stuck"):
        backend.close(mesh)
    assert rec.calls[-3:] == [SUBMESHES, CLOSE, FABRIC_RESET]


def test_zero_devices_raise_device_not_found_with_host_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder(monkeypatch, FakeCluster(devices=0))
    with pytest.raises(TTDeviceNotFoundError) as info:
        TtnnMeshBackend(TTConfig()).open(preset("N150"))
    assert "No Tenstorrent device was found" in str(info.value)
    assert all(hint in str(info.value) for hint in HOST_HINTS)
    assert rec.calls == [COUNT]


def test_failing_count_raises_device_not_found_without_backtrace(monkeypatch: pytest.MonkeyPatch) -> None:
    error = RuntimeError("TT_FATAL @ tt_cluster.cpp:129: num_chips > 0\ninfo:\nNo chips detected in the cluster\n"
                         "backtrace:\n --- frame")
    recorder(monkeypatch, FakeCluster(devices=error))
    with pytest.raises(TTDeviceNotFoundError) as info:
        TtnnMeshBackend(TTConfig()).available_devices()
    message = str(info.value)
    assert "No chips detected in the cluster" in message and "backtrace" not in message
    assert all(hint in message for hint in HOST_HINTS)
    assert info.value.__cause__ is error


def test_mesh_larger_than_available_names_mesh_device_shape_and_count(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = recorder(monkeypatch, FakeCluster(devices=8, cluster_type="T3K"))
    with pytest.raises(TTConfigError) as info:
        TtnnMeshBackend(TTConfig()).open(preset("TG"))
    message = str(info.value)
    assert info.value.setting == "MESH_DEVICE"
    assert "(8,4)" in message and "needs 32" in message and "found 8" in message
    assert rec.calls == [COUNT]


def test_missing_ttnn_package_raises_device_not_found_with_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ttnn", None)
    with pytest.raises(TTDeviceNotFoundError) as info:
        TtnnMeshBackend(TTConfig())
    assert "vllm-tt-platform[ttnn]" in str(info.value)
    assert all(hint in str(info.value) for hint in HOST_HINTS)


def test_make_backend_picks_ttnn_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder(monkeypatch, FakeCluster())
    backend = make_backend(TTConfig(mesh_backend="ttnn"))
    assert isinstance(backend, TtnnMeshBackend) and backend.name == "ttnn"


def test_plan_description_says_what_was_chosen_and_why() -> None:
    plan = plan_open(TTConfig(trace_mode="none", dispatch_core_axis="row"), preset("TG"), lambda: "unused")
    text = plan.describe()
    assert "fabric FABRIC_1D_RING (STRICT_INIT) because the default for a multi-chip GALAXY cluster" in text
    assert "MESH_DEVICE=TG" in text and "dispatch axis row" in text and "trace region off" in text


# 3. The real ttnn on this machine, which has no Tenstorrent device.

NO_DEVICE_SCRIPT = textwrap.dedent("""
    import time
    from vllm_tt_platform.mesh.backend import make_backend
    from vllm_tt_platform.mesh.shape import MeshRequest
    from vllm_tt_platform.config.options import TTConfig
    from vllm_tt_platform.errors import TTDeviceNotFoundError
    from vllm_tt_platform.mesh.shape import MeshShape

    backend = make_backend(TTConfig.from_sources({"mesh_backend": "ttnn"}, environ={}))
    steps = [backend.available_devices, lambda: backend.open(MeshRequest(MeshShape(1, 1), "test"))]
    for step in steps:
        start = time.monotonic()
        try:
            step()
            print("RESULT|-1|opened without error")
        except TTDeviceNotFoundError as exc:
            print(f"RESULT|{time.monotonic() - start:.2f}|" + str(exc).replace("\\n", " "))
""")


def test_real_ttnn_without_device_fails_fast_with_device_not_found() -> None:
    """Runs in a child process so a ttnn hang ends in a timeout, not a stuck test session."""
    done = subprocess.run([sys.executable, "-c", NO_DEVICE_SCRIPT], capture_output=True, text=True, timeout=300)
    results = [line.split("|", 2) for line in done.stdout.splitlines() if line.startswith("RESULT|")]
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(results) == 2, done.stdout[-3000:]
    for _, seconds, message in results:
        assert float(seconds) < 30
        assert "No Tenstorrent device was found" in message and "No chips detected" in message
        assert all(hint in message for hint in HOST_HINTS)
