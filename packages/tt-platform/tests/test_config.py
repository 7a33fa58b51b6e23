"""TTConfig: every option parsed once, unknown keys and bad values rejected with the fix."""

from __future__ import annotations

import pytest
from vllm_tt_platform.config.options import TTConfig, markdown_reference
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.shape import MESH_PRESETS, MeshShape, parse_mesh_device


def test_defaults_and_provenance():
    config = TTConfig.from_sources({}, environ={})
    assert config.mesh_backend == "ttnn"
    assert config.trace_mode == "all"
    assert config.sample_on_device_mode is None
    assert set(config.provenance.values()) == {"default"}


def test_values_from_dotted_cli_and_env():
    config = TTConfig.from_sources(
        {"sample_on_device_mode": "decode_only", "trace_region_size": 80_000_000, "always_compat_sampling": True},
        environ={"TT_MESH_BACKEND": "host"},
    )
    assert config.mesh_backend == "host" and config.provenance["mesh_backend"] == "env"
    assert config.sample_on_device_mode == "decode_only" and config.provenance["sample_on_device_mode"] == "set"
    assert config.trace_region_size == 80_000_000
    assert config.always_compat_sampling is True


def test_prefill_hold_is_a_number():
    assert TTConfig.from_sources({"prefill_hold": 0}, environ={}).prefill_hold == 0.0
    assert TTConfig.from_sources({"prefill_hold": "0.25"}, environ={}).prefill_hold == 0.25


def test_scheduler_options_are_the_schedulers_declarations():
    # One source: the scheduler's OptionSpecs give type, default, minimum and doc.
    from vllm_tt_scheduler import USER_OPTIONS

    declared = {f.name: f for f in TTConfig.options() if "scheduler" in f.metadata}
    assert list(declared) == [spec.name for spec in USER_OPTIONS]
    for spec in USER_OPTIONS:
        f = declared[spec.name]
        assert f.metadata["scheduler"] is spec
        assert (f.type, f.default, f.metadata["minimum"], f.metadata["doc"]) == (
            spec.kind.__name__, spec.default, spec.minimum, spec.doc)


def test_explicit_key_beats_environment():
    config = TTConfig.from_sources({"mesh_backend": "ttnn"}, environ={"TT_MESH_BACKEND": "host"})
    assert config.mesh_backend == "ttnn"


def test_internal_keys_are_not_user_options():
    TTConfig.from_sources({"_lanes": 4, "_prefill_trace_lens": [128]}, environ={})


def test_every_ttnn_fabric_member_is_accepted():
    import ttnn

    for name in ttnn.FabricConfig.__members__:
        assert TTConfig.from_sources({"fabric_config": name}, environ={}).fabric_config == name


BAD = [
    ({"trace_mod": "all"}, "--additional-config.tt.trace_mod", "trace_mode"),
    ({"sample_on_device": "all"}, "--additional-config.tt.sample_on_device", "sample_on_device_mode"),
    ({"mesh_backend": "gpu"}, "--additional-config.tt.mesh_backend", "host"),
    ({"sample_on_device_mode": "always"}, "--additional-config.tt.sample_on_device_mode", "decode_only"),
    ({"trace_mode": "decode"}, "--additional-config.tt.trace_mode", "decode_only"),
    ({"always_compat_sampling": "maybe"}, "--additional-config.tt.always_compat_sampling", "true or false"),
    ({"enable_model_warmup": 3}, "--additional-config.tt.enable_model_warmup", "true or false"),
    ({"trace_region_size": "big"}, "--additional-config.tt.trace_region_size", "integer"),
    ({"trace_region_size": -1}, "--additional-config.tt.trace_region_size", ">= 0"),
    ({"worker_l1_size": 0}, "--additional-config.tt.worker_l1_size", ">= 1"),
    ({"l1_small_size": True}, "--additional-config.tt.l1_small_size", "integer"),
    ({"fabric_config": "FABRIC_3D"}, "--additional-config.tt.fabric_config", "FABRIC_1D"),
    ({"fabric_reliability_mode": "STRICT"}, "--additional-config.tt.fabric_reliability_mode", "STRICT_INIT"),
    ({"dispatch_core_axis": "diagonal"}, "--additional-config.tt.dispatch_core_axis", "row"),
    ({"optimizations": "speed"}, "--additional-config.tt.optimizations", "performance"),
    ({"prefill_burst": 0}, "--additional-config.tt.prefill_burst", ">= 1"),
    ({"mesh_backend": 1}, "--additional-config.tt.mesh_backend", "string"),
    ({"prefill_hold": -0.5}, "--additional-config.tt.prefill_hold", ">= 0"),
    ({"prefill_hold": "soon"}, "--additional-config.tt.prefill_hold", "a number"),
]


@pytest.mark.parametrize(("tt", "setting", "hint"), BAD, ids=[b[1].rsplit(".", 1)[-1] + str(i) for i, b in enumerate(BAD)])
def test_bad_values_name_the_setting_and_fix(tt, setting, hint):
    with pytest.raises(TTConfigError) as info:
        TTConfig.from_sources(tt, environ={})
    assert info.value.setting == setting
    assert setting in str(info.value) and hint in str(info.value)


def test_bad_environment_value_names_the_variable():
    with pytest.raises(TTConfigError, match="TT_MESH_BACKEND"):
        TTConfig.from_sources({}, environ={"TT_MESH_BACKEND": "cuda"})


@pytest.mark.parametrize(("name", "shape"), [
    ("N150", (1, 1)), ("N300", (1, 2)), ("T3K", (1, 8)), ("TG", (8, 4)), ("P100", (1, 1)), ("P150", (1, 1)),
    ("P150x2", (1, 2)), ("P300", (1, 2)), ("P150x4", (1, 4)), ("P300x2", (1, 4)), ("P150x8", (1, 8)),
    ("BH-Galaxy", (8, 4)), ("t3k", (1, 8)), ("(2,4)", (2, 4)), ("[1, 8]", (1, 8)),
])
def test_mesh_device_presets_and_shapes(name, shape):
    assert parse_mesh_device(name) == MeshShape(*shape)


def test_galaxy_is_eight_rows_of_four_everywhere():
    assert MESH_PRESETS["TG"] == MESH_PRESETS["BH-Galaxy"] == MeshShape(8, 4)
    assert MeshShape(8, 4).split(4) == MeshShape(2, 4)
    assert MeshShape(1, 8).split(2) == MeshShape(1, 4)


@pytest.mark.parametrize("value", ["N151", "(0,2)", "(1,2,3)", "[a,b]", ""])
def test_unknown_mesh_device_lists_presets(value):
    with pytest.raises(TTConfigError) as info:
        parse_mesh_device(value)
    assert info.value.setting == "MESH_DEVICE" and "T3K" in str(info.value)


def test_reference_doc_lists_every_option():
    doc = markdown_reference()
    for f in TTConfig.options():
        assert f"`{f.name}`" in doc
