"""The host backend's own ``tt.host_*`` keys: declared by ``HostMeshBackend.options``, parsed and
checked by ``TTConfig`` like the platform's, refused with another backend, listed in the
reference, and read back by the host backend."""

from __future__ import annotations

import pytest
from vllm_tt_host.backend import HostMeshBackend
from vllm_tt_host.options import HostOptions
from vllm_tt_platform.config.options import TTConfig, markdown_reference
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.backend import option_tables
from vllm_tt_platform.mesh.shape import MeshRequest, MeshShape


def test_the_installed_host_backend_declares_its_option_table():
    assert option_tables()["host"] is HostOptions and "ttnn" not in option_tables()


def test_config_option_is_checked_and_host_only():
    config = TTConfig.from_sources({"mesh_backend": "host", "host_device_time": "llama-3.1-8b@N150",
                                    "host_skip_math": "true"}, environ={})
    assert HostOptions.of(config) == HostOptions(host_device_time="llama-3.1-8b@N150", host_skip_math=True)
    assert config.provenance["host_device_time"] == "set" and "host_skip_math=True (set)" in config.summary()
    assert HostOptions.of(TTConfig.from_sources({"mesh_backend": "host"}, environ={})) == HostOptions()
    with pytest.raises(TTConfigError, match=r"--additional-config\.tt\.host_device_time='soon'"):
        TTConfig.from_sources({"mesh_backend": "host", "host_device_time": "soon"}, environ={})
    for key, value in (("host_device_time", "25ms"), ("host_skip_math", True)):
        with pytest.raises(TTConfigError, match=f"{key}.*mesh_backend host"):
            TTConfig.from_sources({"mesh_backend": "ttnn", key: value}, environ={})
    assert TTConfig.from_sources({"mesh_backend": "ttnn", "host_skip_math": False}, environ={}).backend_options == {}


def test_a_misspelt_host_key_gets_the_closest_one():
    with pytest.raises(TTConfigError, match=r"did you mean --additional-config\.tt\.host_skip_math\?"):
        TTConfig.from_sources({"mesh_backend": "host", "host_skip_maths": True}, environ={})


def test_reference_doc_lists_the_host_options():
    doc = markdown_reference()
    assert "| `host_device_time` | str, optional | `None` |" in doc and "| `host_skip_math` | bool | `False` |" in doc


def test_the_backend_opens_the_device_its_options_describe():
    config = TTConfig.from_sources({"mesh_backend": "host", "host_device_time": "25ms", "host_skip_math": True},
                                   environ={})
    backend = HostMeshBackend(config)
    device = backend.open(MeshRequest(MeshShape(1, 2), "test", "N300"))
    try:
        assert device.skip_math and device.options.device_time is not None
        assert device.options.device_time.fixed_s == pytest.approx(0.025) and device.options.preset == "N300"
    finally:
        backend.close(device)
