"""The mesh seam finds backends by name through the ``vllm_tt.mesh_backends`` entry points; a
backend no installed distribution registers (``host`` without vllm-tt-host) is a clear error."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.errors import TTConfigError, TTMeshBackendNotInstalledError
from vllm_tt_platform.mesh.backend import MESH_BACKENDS_GROUP, find_backend, make_backend
from vllm_tt_platform.mesh.ttnn_mesh import TtnnMeshBackend

TTNN_ONLY = (EntryPoint("ttnn", "vllm_tt_platform.mesh.ttnn_mesh:TtnnMeshBackend", MESH_BACKENDS_GROUP),)
"""What a production install (the platform without vllm-tt-host) registers."""


def test_the_platform_registers_the_ttnn_backend_itself():
    assert find_backend("ttnn").load() is TtnnMeshBackend


def test_host_without_its_distribution_names_the_setting_the_distribution_and_the_install():
    with pytest.raises(TTMeshBackendNotInstalledError) as info:
        find_backend("host", TTNN_ONLY)
    message = str(info.value)
    assert isinstance(info.value, TTConfigError) and info.value.distribution == "vllm-tt-host"
    for part in ("TT_MESH_BACKEND", "--additional-config.tt.mesh_backend", "'host'", "installed backend (ttnn)",
                 "pip install vllm-tt-host", "pip install ./packages/tt-host"):
        assert part in message, message


def test_make_backend_refuses_before_building_anything():
    with pytest.raises(TTMeshBackendNotInstalledError, match="vllm-tt-host"):
        make_backend(TTConfig(mesh_backend="host"), TTNN_ONLY)


def test_a_backend_nobody_names_asks_for_the_distribution_registering_it():
    with pytest.raises(TTMeshBackendNotInstalledError, match="registers it in vllm_tt.mesh_backends") as info:
        find_backend("gpu", ())
    assert info.value.distribution is None and "none installed" in str(info.value)
