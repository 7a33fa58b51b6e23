"""The vllm.general_plugins entry point registers the TT architectures with vLLM."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

import pytest
from vllm_tt_models_registry import BundleError, plugin


@pytest.fixture
def vllm_registry():
    """vLLM's global model registry, restored after the test; the plugin starts unregistered (an
    engine config built earlier in the process, e.g. by a startup-check test, registered it)."""
    from vllm import ModelRegistry

    saved = dict(ModelRegistry.models)
    plugin._registered_for = None
    yield ModelRegistry
    ModelRegistry.models.clear()
    ModelRegistry.models.update(saved)
    plugin._registered_for = None


@pytest.fixture
def plugin_log():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("vllm.vllm_tt_models_registry.plugin")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(handler)


def test_entry_point_is_declared() -> None:
    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps["tt_model_registry"] == "vllm_tt_models_registry.plugin:register"


def test_register_adds_tt_archs_to_vllm(vllm_registry, plugin_log) -> None:
    registry = plugin.register({})
    assert registry is not None
    supported = vllm_registry.get_supported_archs()
    for arch in ("TTLlamaForCausalLM", "TTQwen3_5ForConditionalGeneration", "TTGptOssForCausalLM"):
        assert arch in supported
    lazy = vllm_registry.models["TTLlamaForCausalLM"]
    assert (lazy.module_name, lazy.class_name) == (
        "models.tt_transformers.tt.generator_vllm",
        "LlamaForCausalLM",
    )
    assert "LlamaForCausalLM" in supported  # vLLM's own entry is left alone
    assert vllm_registry.models["LlamaForCausalLM"].module_name.startswith("vllm.")
    messages = [r.getMessage() for r in plugin_log]
    assert messages[0].startswith("TT models for mesh backend 'ttnn': 17 architectures")
    assert any(m.strip().startswith("builtin: TTLlamaForCausalLM") for m in messages)


def test_register_is_idempotent_per_environment(vllm_registry, plugin_log) -> None:
    assert plugin.register({}) is not None
    assert plugin.register({}) is None  # same environment: nothing to do, nothing logged again
    assert len([r for r in plugin_log if "architectures" in r.getMessage()]) == 1
    assert plugin.register({"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"}) is not None
    assert (
        vllm_registry.models["TTLlamaForCausalLM"].module_name
        == "models.demos.llama3_70b_galaxy.tt.generator_vllm"
    )


def test_register_serves_a_bundle_and_logs_builtins_off(vllm_registry, plugin_log, make_bundle) -> None:
    folder = make_bundle("plug", metadata={"arch": "LlamaForCausalLM", "main_class": "plug_adapter:FooModel"})
    plugin.register({"EXTRA_MODELS_DIR": str(folder.parent), "TT_VLLM_BUILTIN_MODELS": "0"})
    lazy = vllm_registry.models["TTLlamaForCausalLM"]
    assert (lazy.module_name, lazy.class_name) == ("plug_adapter", "FooModel")
    assert lazy.load_model_cls().__name__ == "FooModel"  # vLLM can import it by name
    assert any("TT_VLLM_BUILTIN_MODELS=0" in r.getMessage() for r in plugin_log)


def test_broken_bundle_fails_startup(vllm_registry, make_bundle) -> None:
    folder = make_bundle("bad", metadata='{"arch": ')
    with pytest.raises(BundleError, match="not valid JSON"):
        plugin.register({"EXTRA_MODELS_DIR": str(folder.parent)})
    assert plugin._registered_for is None  # a retry re-checks


def test_no_models_warns(vllm_registry, plugin_log) -> None:
    plugin.register({"TT_VLLM_BUILTIN_MODELS": "off"})
    assert any(
        r.levelno == logging.WARNING and "no TT model is registered" in r.getMessage() for r in plugin_log
    )
