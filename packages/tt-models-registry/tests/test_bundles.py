"""Bundles: a good one registers and imports cleanly; every broken one fails with a message
naming the bundle folder, the field or method, and the fix."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
from vllm_tt_models_registry.bundle import find_bundle_folders, load_bundle, load_bundles
from vllm_tt_models_registry.bundle_import import bundle_finder
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.errors import BundleError

GOOD = {"arch": "FooForCausalLM", "main_class": "{m}:FooModel"}


def _meta(**changes: Any) -> dict[str, Any]:
    meta = {**GOOD, **changes}
    return {k: v for k, v in meta.items() if v is not None}


def test_good_bundle_loads_and_is_importable_without_sys_path(make_bundle) -> None:
    path_before = list(sys.path)
    folder = make_bundle("good")
    bundle = load_bundle(folder)
    assert bundle.arch == "TTFooForCausalLM"
    assert bundle.target == "good_adapter:FooModel"
    assert bundle.source == f"bundle:{folder.resolve()}"
    assert bundle.modules == ("good_adapter",)
    assert bundle.capabilities.supports_async_decode
    assert sys.path == path_before
    # vLLM imports the lazy target by name, in any process where the plugin ran
    assert importlib.import_module("good_adapter").FooModel.__name__ == "FooModel"


def test_bundle_modules_can_import_their_siblings(make_bundle, adapter_source) -> None:
    folder = make_bundle(
        "sib",
        metadata={"arch": "FooForCausalLM", "main_class": "sib_pkg.model:FooModel"},
        files={
            "sib_helpers.py": "SCALE = 3\n",
            "sib_pkg/__init__.py": "",
            "sib_pkg/model.py": "import sib_helpers\n" + adapter_source("FooModel"),
        },
    )
    bundle = load_bundle(folder)
    assert bundle.modules == ("sib_helpers", "sib_pkg")
    assert importlib.import_module("sib_helpers").SCALE == 3


def test_metadata_capabilities_are_merged_over_the_class(make_bundle) -> None:
    folder = make_bundle(
        "caps",
        metadata=_meta(
            main_class="caps_adapter:FooModel",
            capabilities={"single_program_lanes": True, "prefill_trace_lens": [256, 128]},
        ),
    )
    caps = load_bundle(folder).capabilities
    assert caps.single_program_lanes and caps.supports_prefix_caching
    assert caps.prefill_trace_lens == (128, 256)


def test_arch_already_prefixed_is_kept(make_bundle) -> None:
    folder = make_bundle("pre", metadata=_meta(arch="TTFooForCausalLM", main_class="pre_adapter:FooModel"))
    assert load_bundle(folder).arch == "TTFooForCausalLM"


# (case id, metadata or raw text, extra files, expected field text, expected problem text)
BROKEN: list[tuple[str, Any, dict[str, str] | None, str, str]] = [
    ("bad_json", '{"arch": "FooForCausalLM",', None, "vllm_metadata.json", "not valid JSON"),
    ("not_object", "[1, 2]", None, "vllm_metadata.json", "must hold a JSON object"),
    ("missing_arch", _meta(arch=None), None, "field 'arch'", "missing"),
    ("missing_main_class", {"arch": "FooForCausalLM"}, None, "field 'main_class'", "missing"),
    ("bad_arch", _meta(arch="Foo For CausalLM"), None, "field 'arch'", "is not valid"),
    ("arch_not_string", _meta(arch=3), None, "field 'arch'", "is not valid"),
    (
        "no_colon",
        _meta(main_class="{m}.FooModel"),
        None,
        "field 'main_class'",
        "not of the form 'module:Class'",
    ),
    ("unknown_field", _meta(archs=["x"]), None, "vllm_metadata.json", "unknown field(s) 'archs'"),
    (
        "caps_type",
        _meta(capabilities={"supports_async_decode": "yes"}),
        None,
        "field 'capabilities'",
        "supports_async_decode",
    ),
    (
        "caps_unknown",
        _meta(capabilities={"supports_async_decoding": True}),
        None,
        "field 'capabilities'",
        "unknown capability 'supports_async_decoding'",
    ),
    (
        "caps_not_object",
        _meta(capabilities=["single_program_lanes"]),
        None,
        "field 'capabilities'",
        "is not of type 'object'",
    ),
    (
        "newer_version",
        _meta(min_plugin_version="99.0"),
        None,
        "field 'min_plugin_version'",
        "needs vllm-tt-models-registry >= 99.0",
    ),
    (
        "bad_version",
        _meta(min_plugin_version="banana"),
        None,
        "field 'min_plugin_version'",
        "is not a version",
    ),
    (
        "unimportable_module",
        _meta(main_class="nowhere_to_be_found:FooModel"),
        None,
        "main_class 'nowhere_to_be_found:FooModel'",
        "cannot be found",
    ),
    (
        "import_raises",
        None,
        {"{m}.py": "import no_such_dependency_xyz\n"},
        "main_class '{m}:FooModel'",
        "importing '{m}' failed: ModuleNotFoundError",
    ),
    ("syntax_error", None, {"{m}.py": "class FooModel(:\n"}, "main_class '{m}:FooModel'", "SyntaxError"),
    ("missing_class", _meta(main_class="{m}:Missing"), None, "main_class '{m}:Missing'", "has no 'Missing'"),
    (
        "missing_method",
        None,
        {"{m}.py": "REMOVE:decode_forward"},
        "main_class '{m}:FooModel'",
        "has no method decode_forward()",
    ),
    (
        "init_not_classmethod",
        None,
        {"{m}.py": "INIT_AS_METHOD"},
        "main_class '{m}:FooModel'",
        "initialize_vllm_model must be a classmethod",
    ),
    (
        "class_caps_bad",
        None,
        {"{m}.py": "CLASS_CAPS"},
        "main_class '{m}:FooModel'",
        "model_capabilities['supports_async_decode'] must be true or false",
    ),
    (
        "shadows_json",
        _meta(main_class="json:FooModel"),
        {"json.py": "ADAPTER"},
        "module 'json'",
        "shadow the installed module 'json'",
    ),
    (
        "shadows_torch",
        _meta(main_class="torch.model:FooModel"),
        {"torch/__init__.py": "", "torch/model.py": "ADAPTER"},
        "module 'torch'",
        "shadow the installed module 'torch'",
    ),
]

_FIXES = {
    "missing_arch": 'set "arch"',
    "no_colon": '"main_class": "{m}:FooModel"',
    "newer_version": "upgrade vllm-tt",
    "shadows_json": "rename the bundle's json",
    "missing_method": "implement decode_forward(",
    "init_not_classmethod": "add @classmethod",
}


def _file_text(marker: str, adapter_source) -> str:
    source = adapter_source("FooModel")
    if marker == "ADAPTER":
        return source
    if marker.startswith("REMOVE:"):
        method = marker.removeprefix("REMOVE:")
        # a class with no base and no such method: rename the base's too
        return source.replace(f"def {method}(", f"def _{method}_(")
    if marker == "INIT_AS_METHOD":
        return source.replace(
            "    @classmethod\n    def initialize_vllm_model(", "    def initialize_vllm_model("
        )
    if marker == "CLASS_CAPS":
        return source.replace('"supports_async_decode": True', '"supports_async_decode": "yes"')
    return marker


@pytest.mark.parametrize(
    ("case", "metadata", "files", "field", "problem"), BROKEN, ids=[c[0] for c in BROKEN]
)
def test_broken_bundle_fails_naming_folder_field_and_fix(
    make_bundle,
    adapter_source,
    case: str,
    metadata: Any,
    files: dict[str, str] | None,
    field: str,
    problem: str,
) -> None:
    module = f"{case}_adapter"

    def fill(text: str) -> str:
        return text.replace("{m}", module)

    if isinstance(metadata, dict):
        metadata = {k: fill(v) if isinstance(v, str) else v for k, v in metadata.items()}
    elif metadata is None:
        metadata = {k: fill(v) for k, v in GOOD.items()}
    if files is not None:
        files = {fill(name): _file_text(text, adapter_source) for name, text in files.items()}
    folder = make_bundle(case, metadata=metadata, files=files)
    with pytest.raises(BundleError) as info:
        load_bundle(folder)
    error = info.value
    message = str(error)
    assert error.folder == folder.resolve()
    assert message.startswith(f"model bundle {folder.resolve()}: ")
    assert fill(field) in error.field, message
    assert fill(problem) in error.problem, message
    assert error.fix and "Fix: " in message
    if case in _FIXES:
        assert fill(_FIXES[case]) in error.fix, message
    assert not any(f == folder.resolve() for f in bundle_finder().claims().values()), "claims released"


def test_duplicate_arch_across_bundles(make_bundle) -> None:
    first = make_bundle("one", metadata={"arch": "FooForCausalLM", "main_class": "one_adapter:FooModel"})
    second = make_bundle("two", metadata={"arch": "TTFooForCausalLM", "main_class": "two_adapter:FooModel"})
    with pytest.raises(BundleError) as info:
        load_bundles(first.parent)
    assert info.value.folder == second.resolve()
    assert "field 'arch'" in info.value.field
    assert f"also served by bundle {first.resolve()}" in info.value.problem


def test_same_module_name_in_two_bundles(make_bundle, adapter_source) -> None:
    files = {"shared_mod.py": adapter_source("FooModel")}
    make_bundle("aaa", metadata={"arch": "AForCausalLM", "main_class": "shared_mod:FooModel"}, files=files)
    second = make_bundle(
        "bbb", metadata={"arch": "BForCausalLM", "main_class": "shared_mod:FooModel"}, files=files
    )
    with pytest.raises(BundleError, match="already provides a module of that name") as info:
        load_bundles(second.parent)
    assert info.value.field == "module 'shared_mod'"


def test_already_imported_module_of_the_same_name_is_shadowing(make_bundle, adapter_source) -> None:
    # sys.modules has 'vllm_tt_models_registry' (imported by this test)
    folder = make_bundle(
        "dup",
        metadata={"arch": "FooForCausalLM", "main_class": "vllm_tt_models_registry:FooModel"},
        files={"vllm_tt_models_registry.py": adapter_source("FooModel")},
    )
    with pytest.raises(BundleError, match="shadow the installed module"):
        load_bundle(folder)


def test_reloading_the_same_bundle_is_fine(make_bundle) -> None:
    folder = make_bundle("again")
    assert load_bundle(folder).arch == load_bundle(folder).arch


def test_discovery_skips_folders_without_metadata_and_hidden_ones(make_bundle, tmp_path: Path) -> None:
    folder = make_bundle("real")
    (tmp_path / "models" / "notes").mkdir()
    hidden = tmp_path / "models" / ".cache"
    hidden.mkdir()
    (hidden / "vllm_metadata.json").write_text("{}")
    (tmp_path / "models" / "README.md").write_text("x")
    assert find_bundle_folders(tmp_path / "models") == [folder]


def test_models_dir_pointing_at_a_bundle_says_to_use_the_parent(make_bundle) -> None:
    folder = make_bundle("direct")
    with pytest.raises(BundleError, match="points at a bundle itself") as info:
        load_bundles(folder)
    assert f"EXTRA_MODELS_DIR={folder.parent}" in info.value.fix


def test_every_metadata_problem_is_reported_with_its_field(make_bundle) -> None:
    folder = make_bundle("all", metadata={"archs": "x", "main_class": "no colon", "capabilities": {"max_device_top_k": -1}})
    with pytest.raises(BundleError) as info:
        load_bundle(folder)
    assert [p.field for p in info.value.problems] == [
        "vllm_metadata.json",
        "vllm_metadata.json field 'arch'",
        "vllm_metadata.json field 'main_class'",
        "vllm_metadata.json field 'capabilities'",
    ]
    assert info.value.field == "vllm_metadata.json"
    message = str(info.value)
    assert message.startswith(f"model bundle {folder.resolve()}: 4 problems:\n  - vllm_metadata.json: unknown")
    assert all(f"\n  - {p}" in message for p in info.value.problems)


def test_models_dir_that_is_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="is not a directory") as info:
        load_bundles(tmp_path / "missing")
    assert info.value.field == "environment variable EXTRA_MODELS_DIR"
    assert info.value.fix == "point EXTRA_MODELS_DIR at a folder of bundles, or unset it"


def test_capabilities_default_when_nothing_declared(make_bundle, adapter_source) -> None:
    source = adapter_source("FooModel").replace("model_capabilities = {", "_unused = {")
    folder = make_bundle("plain", files={"plain_adapter.py": source})
    assert load_bundle(folder).capabilities == ModelCapabilities()


def test_metadata_that_is_not_utf8(make_bundle) -> None:
    folder = make_bundle("latin")
    (folder / "vllm_metadata.json").write_bytes(b'{"arch": "Caf\xe9"}')
    with pytest.raises(BundleError, match="cannot be read") as info:
        load_bundle(folder)
    assert info.value.field == "vllm_metadata.json"
