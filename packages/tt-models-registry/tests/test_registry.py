"""The registry: the builtin table, variants, precedence of bundles and model sources."""

from __future__ import annotations

import sys
import types
from importlib.metadata import EntryPoint

import pytest
from vllm_tt_models_registry import (
    BundleError,
    RegisteredModel,
    RegistryError,
    TTModelRegistry,
    load_registry,
    tt_arch_name,
)
from vllm_tt_models_registry.builtin import BUILTIN_FAMILIES
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.envs import TT_LLAMA_TEXT_VER, TT_QWEN3_TEXT_VER
from vllm_tt_models_registry.names import is_target, split_target, target_hint
from vllm_tt_models_registry.sources import (
    MODEL_SOURCES_GROUP,
    ModelSource,
    installed_source_names,
    load_source,
)

SEED_ARCHS = {
    "TTLlamaForCausalLM",
    "TTMllamaForConditionalGeneration",
    "TTQwen2ForCausalLM",
    "TTQwen3ForCausalLM",
    "TTQwen3_5ForConditionalGeneration",
    "TTQwen3_5ForCausalLM",
    "TTQwen2_5_VLForConditionalGeneration",
    "TTQwen3VLForConditionalGeneration",
    "TTMistralForCausalLM",
    "TTMistral3ForConditionalGeneration",
    "TTGemma3ForConditionalGeneration",
    "TTGemma3ForCausalLM",
    "TTGemma4ForCausalLM",
    "TTGemma4ForConditionalGeneration",
    "TTGemma4UnifiedForConditionalGeneration",
    "TTDeepseekV3ForCausalLM",
    "TTGptOssForCausalLM",
}


def test_tt_arch_name() -> None:
    assert tt_arch_name("LlamaForCausalLM") == "TTLlamaForCausalLM"
    assert tt_arch_name("TTLlamaForCausalLM") == "TTLlamaForCausalLM"


def test_target_helpers() -> None:
    assert is_target("a.b_c:D") and not is_target("a.b.D") and not is_target("a:b:c") and not is_target(3)
    assert split_target("a.b:C") == ("a.b", "C")
    assert target_hint("pkg.mod.Cls") == "pkg.mod:Cls"


def test_builtin_table_serves_every_seed_family_with_well_formed_lazy_targets() -> None:
    registry = load_registry(environ={})
    assert set(registry.archs()) == SEED_ARCHS
    for model in registry.entries():
        assert model.source == "builtin"
        assert is_target(model.target), model
        assert model.target.startswith("models."), model  # tt-metal's package
    assert "models" not in sys.modules  # nothing was imported


def test_default_variants_and_declared_lanes() -> None:
    registry = load_registry(environ={})
    assert (
        registry.resolve("TTLlamaForCausalLM").target
        == "models.tt_transformers.tt.generator_vllm:LlamaForCausalLM"
    )
    assert (
        registry.resolve("TTQwen3ForCausalLM").target
        == "models.tt_transformers.tt.generator_vllm:QwenForCausalLM"
    )
    assert dict(registry.resolve("TTGptOssForCausalLM").overrides) == {
        "single_program_lanes": True, "kv_cache_kinds": ("full_attention", "sliding_window"),
    }
    assert registry.resolve("TTLlamaForCausalLM").overrides == ()


def test_galaxy_variants_are_selected_by_env() -> None:
    registry = load_registry(
        environ={"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy", "TT_QWEN3_TEXT_VER": "qwen3_32b_galaxy"}
    )
    llama = registry.resolve("TTLlamaForCausalLM")
    qwen = registry.resolve("TTQwen3ForCausalLM")
    assert llama.target == "models.demos.llama3_70b_galaxy.tt.generator_vllm:LlamaForCausalLM"
    assert qwen.target == "models.demos.llama3_70b_galaxy.tt.generator_vllm:QwenForCausalLM"
    assert dict(llama.overrides) == dict(qwen.overrides) == {"single_program_lanes": True}
    assert registry.resolve("TTQwen2ForCausalLM").target.endswith(
        "tt_transformers.tt.generator_vllm:QwenForCausalLM"
    )


@pytest.mark.parametrize("var", ["TT_LLAMA_TEXT_VER", "TT_QWEN3_TEXT_VER"])
def test_bad_variant_names_variable_value_and_allowed(var: str) -> None:
    with pytest.raises(RegistryError) as info:
        load_registry(environ={var: "llama2_70b"})
    message = str(info.value)
    assert f"{var}='llama2_70b'" in message
    assert "tt_transformers" in message and "Fix:" in message


def test_variant_selectors_match_the_table() -> None:
    selectors = {fam.selector: fam for fam in BUILTIN_FAMILIES if fam.selector is not None}
    assert set(selectors) == {TT_LLAMA_TEXT_VER, TT_QWEN3_TEXT_VER}
    for var, fam in selectors.items():
        assert tuple(fam.variants) == var.allowed
        assert var.default == var.allowed[0]


@pytest.mark.parametrize("value", ["0", "false", "No", " off "])
def test_builtins_off_leaves_only_bundles(make_bundle, value: str) -> None:
    folder = make_bundle("only")
    registry = load_registry(
        environ={"TT_VLLM_BUILTIN_MODELS": value, "EXTRA_MODELS_DIR": str(folder.parent)}
    )
    assert registry.archs() == ("TTFooForCausalLM",)
    assert not registry.builtins_enabled
    assert any("TT_VLLM_BUILTIN_MODELS=0" in line for line in registry.startup_summary())


def test_builtins_off_also_drops_the_backend_source() -> None:
    sources = {"host": ModelSource("host", {"TTLlamaForCausalLM": "host_mod:Llama"})}
    assert len(load_registry("host", environ={"TT_VLLM_BUILTIN_MODELS": "0"}, sources=sources)) == 0


def test_bad_builtin_flag() -> None:
    with pytest.raises(RegistryError, match="TT_VLLM_BUILTIN_MODELS='maybe' is not a boolean"):
        load_registry(environ={"TT_VLLM_BUILTIN_MODELS": "maybe"})


def test_bundle_wins_over_builtin_and_the_summary_says_so(make_bundle) -> None:
    folder = make_bundle(
        "llama", metadata={"arch": "LlamaForCausalLM", "main_class": "llama_adapter:FooModel"}
    )
    registry = load_registry(environ={"EXTRA_MODELS_DIR": str(folder.parent)})
    model = registry.resolve("TTLlamaForCausalLM")
    assert model.source == f"bundle:{folder.resolve()}"
    assert model.target == "llama_adapter:FooModel"
    assert model.bundle_folder == folder.resolve()
    assert ("TTLlamaForCausalLM", "builtin") in registry.shadowed
    summary = "\n".join(registry.startup_summary())
    assert f"bundle:{folder.resolve()}: TTLlamaForCausalLM (over builtin)" in summary
    assert len(registry) == len(SEED_ARCHS)


def test_broken_bundle_fails_registry_build(make_bundle) -> None:
    folder = make_bundle("broken", metadata={"arch": "FooForCausalLM"})
    with pytest.raises(BundleError, match="main_class"):
        load_registry(environ={"EXTRA_MODELS_DIR": str(folder.parent)})


def test_host_source_replaces_the_families_it_implements(make_bundle) -> None:
    sources = {
        "host": ModelSource(
            "host", {"TTLlamaForCausalLM": "host_mod:HostLlama", "TTQwen3ForCausalLM": "host_mod:HostQwen3"}
        )
    }
    registry = load_registry("host", environ={}, sources=sources)
    assert registry.resolve("TTLlamaForCausalLM") == RegisteredModel(
        "TTLlamaForCausalLM", "host_mod:HostLlama", "host"
    )
    assert registry.resolve("TTQwen3ForCausalLM").source == "host"
    assert registry.resolve("TTGemma3ForConditionalGeneration").source == "builtin"
    assert ("TTLlamaForCausalLM", "builtin") in registry.shadowed
    # bundles still win over the host source
    folder = make_bundle("hb", metadata={"arch": "LlamaForCausalLM", "main_class": "hb_adapter:FooModel"})
    with_bundle = load_registry("host", environ={"EXTRA_MODELS_DIR": str(folder.parent)}, sources=sources)
    assert with_bundle.resolve("TTLlamaForCausalLM").source.startswith("bundle:")
    assert ("TTLlamaForCausalLM", "host") in with_bundle.shadowed


def test_ttnn_backend_ignores_sources() -> None:
    sources = {"host": ModelSource("host", {"TTLlamaForCausalLM": "host_mod:HostLlama"})}
    assert (
        load_registry("ttnn", environ={}, sources=sources).resolve("TTLlamaForCausalLM").source == "builtin"
    )


def test_unknown_backend_source_is_an_error() -> None:
    with pytest.raises(RegistryError, match=f"TT_MESH_BACKEND='sim'.*{MODEL_SOURCES_GROUP}"):
        load_registry("sim", environ={}, sources={})


def test_resolve_unknown_lists_archs_and_hints() -> None:
    registry = load_registry(environ={})
    with pytest.raises(RegistryError) as info:
        registry.resolve("FalconForCausalLM")
    message = str(info.value)
    assert "'TTFalconForCausalLM'" in message and "TTLlamaForCausalLM" in message
    assert "EXTRA_MODELS_DIR" in message
    off = load_registry(environ={"TT_VLLM_BUILTIN_MODELS": "0"})
    with pytest.raises(RegistryError, match="unset TT_VLLM_BUILTIN_MODELS"):
        off.resolve("TTLlamaForCausalLM")


def test_resolve_accepts_the_hf_name() -> None:
    registry = load_registry(environ={})
    assert registry.resolve("LlamaForCausalLM").arch == "TTLlamaForCausalLM"
    assert "LlamaForCausalLM" in registry and "TTLlamaForCausalLM" in registry


def test_load_class_of_an_unimportable_builtin_names_the_source() -> None:
    model = load_registry(environ={}).resolve("TTLlamaForCausalLM")
    with pytest.raises(RegistryError) as info:
        model.load_class()
    message = str(info.value)
    assert (
        "TTLlamaForCausalLM (builtin: models.tt_transformers.tt.generator_vllm:LlamaForCausalLM)" in message
    )
    assert "tt-metal" in message and "bundle" in message


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch, adapter_source):
    """A module ``fake_src_mod`` holding a tt-metal-style class and a source table."""
    module = types.ModuleType("fake_src_mod")
    exec(adapter_source("Good"), module.__dict__)
    module.NotAModel = type("NotAModel", (), {})
    module.TABLE = {"LlamaForCausalLM": "fake_src_mod:Good", "TTBadForCausalLM": "fake_src_mod:NotAModel"}
    module.BAD_TABLE = {"LlamaForCausalLM": "fake_src_mod.Good"}
    module.STATED_TABLE = {"LlamaForCausalLM": {"target": "not_importable_mod:Llama",
                                                "capabilities": {"supports_prefix_caching": True}}}
    module.BAD_CAPS_TABLE = {"LlamaForCausalLM": {"target": "x:Y", "capabilities": {"supports_prefix_caching": 1}}}
    module.BAD_KEYS_TABLE = {"LlamaForCausalLM": {"target": "x:Y", "capability": {}}}
    monkeypatch.setitem(sys.modules, "fake_src_mod", module)
    return module


def test_load_class_checks_the_contract_and_names_the_source(fake_module) -> None:
    good = RegisteredModel(
        "TTLlamaForCausalLM", "fake_src_mod:Good", "host", (("single_program_lanes", True),)
    )
    assert good.load_class() is fake_module.Good
    caps = good.capabilities()
    assert caps.single_program_lanes and caps.supports_sample_on_device
    bad = RegisteredModel("TTBadForCausalLM", "fake_src_mod:NotAModel", "host")
    with pytest.raises(
        RegistryError,
        match=r"TTBadForCausalLM \(host: fake_src_mod:NotAModel\): class NotAModel has no method initialize_vllm_model",
    ):
        bad.load_class()
    missing = RegisteredModel("TTXForCausalLM", "fake_src_mod:Nope", "host")
    with pytest.raises(
        RegistryError, match="has no 'Nope'.*reinstall the package providing the model source 'host'"
    ):
        missing.load_class()


def test_load_class_of_a_bundle_raises_bundle_error(make_bundle) -> None:
    folder = make_bundle("lc")
    model = load_registry(environ={"EXTRA_MODELS_DIR": str(folder.parent)}).resolve("TTFooForCausalLM")
    assert model.load_class().__name__ == "FooModel"
    gone = RegisteredModel(model.arch, "lc_adapter:Gone", model.source)
    with pytest.raises(BundleError) as info:
        gone.load_class()
    assert info.value.folder == folder.resolve()


def _eps(*pairs: tuple[str, str]) -> list[EntryPoint]:
    return [EntryPoint(name, value, MODEL_SOURCES_GROUP) for name, value in pairs]


def test_source_from_entry_point(fake_module) -> None:
    source = load_source("host", _eps(("host", "fake_src_mod:TABLE"), ("other", "x:Y")))
    assert source.name == "host"
    assert source.targets["TTLlamaForCausalLM"] == "fake_src_mod:Good"  # HF name was prefixed
    assert installed_source_names(_eps(("b", "x:Y"), ("a", "x:Z"))) == ("a", "b")


def test_a_source_stating_capabilities_is_listed_without_importing_its_classes(fake_module) -> None:
    source = load_source("host", _eps(("host", "fake_src_mod:STATED_TABLE")))
    assert source.targets == {"TTLlamaForCausalLM": "not_importable_mod:Llama"}
    model = load_registry("host", sources={"host": source}).resolve("TTLlamaForCausalLM")
    assert model.listed_capabilities() == ModelCapabilities(supports_prefix_caching=True)
    assert "not_importable_mod" not in sys.modules
    with pytest.raises(RegistryError, match="cannot import 'not_importable_mod'"):
        model.capabilities()  # serving reads the class itself


@pytest.mark.parametrize(
    ("eps", "match"),
    [
        ((("host", "fake_src_mod:BAD_TABLE"),), "is not a 'module:Class' string"),
        ((("host", "fake_src_mod:BAD_CAPS_TABLE"),),
         r"entry 'LlamaForCausalLM': model_capabilities\['supports_prefix_caching'\] must be true or false"),
        ((("host", "fake_src_mod:BAD_KEYS_TABLE"),), r"unknown keys \['capability'\]"),
        ((("host", "fake_src_mod:Good"),), "must be a dict"),
        ((("host", "fake_src_mod:MISSING"),), "loading fake_src_mod:MISSING failed"),
        ((("host", "fake_src_mod:TABLE"), ("host", "other_mod:TABLE")), "declared twice"),
        ((), "no installed package declares one"),
    ],
)
def test_broken_sources_fail_clearly(fake_module, eps, match: str) -> None:
    with pytest.raises(RegistryError, match=match):
        load_source("host", _eps(*eps))


def test_registry_refuses_duplicate_archs() -> None:
    model = RegisteredModel("TTFooForCausalLM", "a:B", "builtin")
    with pytest.raises(RegistryError, match="duplicate architectures"):
        TTModelRegistry((model, model))
