"""The entry points wire the five distributions into vLLM, and the platform only activates
where ttnn imports."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

BLOCK_TTNN = (
    "import sys, importlib.abc\n"
    "class _NoTTNN(importlib.abc.MetaPathFinder):\n"
    "    def find_spec(self, name, path, target=None):\n"
    "        if name == 'ttnn' or name.startswith('ttnn.'):\n"
    "            raise ImportError('ttnn blocked for this test')\n"
    "sys.meta_path.insert(0, _NoTTNN())\n"
)
SHOW_PLATFORM = "from vllm.platforms import current_platform\nprint('PLATFORM=' + type(current_platform).__name__)\n"


def _platform_in_subprocess(prelude: str = "") -> str:
    result = subprocess.run(
        [sys.executable, "-c", prelude + SHOW_PLATFORM], capture_output=True, text=True, timeout=300,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("PLATFORM=")]
    assert lines, f"no platform printed; stderr:\n{result.stderr[-3000:]}"
    return lines[-1].removeprefix("PLATFORM=")


def test_entry_points_are_declared():
    platform = {ep.name: ep.value for ep in entry_points(group="vllm.platform_plugins")}
    general = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert platform["tt"] == "vllm_tt_platform:detect"
    assert general["tt_model_registry"] == "vllm_tt_models_registry.plugin:register"


def test_mesh_backends_and_model_sources_are_declared_by_their_distributions():
    """The platform registers only the ttnn backend; the host backend and its models come from
    vllm-tt-host, which the platform never imports."""
    backends = {ep.name: (ep.value, ep.dist.name if ep.dist else None)
                for ep in entry_points(group="vllm_tt.mesh_backends")}
    sources = {ep.name: (ep.value, ep.dist.name if ep.dist else None)
               for ep in entry_points(group="vllm_tt.model_sources")}
    assert backends == {
        "ttnn": ("vllm_tt_platform.mesh.ttnn_mesh:TtnnMeshBackend", "vllm-tt-platform"),
        "host": ("vllm_tt_host.backend:HostMeshBackend", "vllm-tt-host"),
    }
    assert sources["host"] == ("vllm_tt_host.models:HOST_SOURCE", "vllm-tt-host")


def test_platform_active_when_ttnn_imports():
    assert _platform_in_subprocess() == "TTPlatform"


def test_platform_inactive_without_ttnn():
    assert _platform_in_subprocess(BLOCK_TTNN) != "TTPlatform"


def test_the_class_names_the_platform_sets_resolve_as_vllm_resolves_them():
    # vLLM imports the module and reads the attribute (resolve_obj_by_qualname); the scheduler's
    # classes are lazy attributes of its package root, so a move inside it must keep them there.
    import importlib

    from vllm.v1.core.sched.interface import SchedulerInterface
    from vllm_tt_platform.config import setup

    for name in (setup.SCHEDULER_CLS, setup.ASYNC_SCHEDULER_CLS, setup.LANE_SCHEDULER_CLS, setup.WORKER_CLS):
        module, _, attr = name.rpartition(".")
        resolved = getattr(importlib.import_module(module), attr)
        assert resolved.__name__ == attr, name
        if name != setup.WORKER_CLS:
            assert issubclass(resolved, SchedulerInterface), name
