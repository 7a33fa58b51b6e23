"""The family declarations: ``HOST_MODELS`` is built from them, each names classes of its own
subpackage built on the frame (a decoder) or a pooling model, and each points at the tiny checkpoints its parity tests use."""

from __future__ import annotations

import importlib

import pytest
from vllm_tt_host.models import FAMILIES, HOST_MODELS
from vllm_tt_host.models.frame.family import HostFamily, host_models
from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.tiny import ARCHITECTURES


def test_the_registry_table_is_built_from_the_families():
    assert host_models(FAMILIES) == HOST_MODELS
    assert list(HOST_MODELS) == [arch for family in FAMILIES for arch in family.models]


@pytest.mark.parametrize("family", FAMILIES, ids=[f.package.rsplit(".", 1)[-1] for f in FAMILIES])
def test_a_family_serves_classes_of_its_own_subpackage_on_the_frame(family: HostFamily):
    for arch, target in family.targets().items():
        module, name = target.split(":")
        assert module.startswith(family.package + "."), (arch, target)
        cls = getattr(importlib.import_module(module), name)
        on_frame = issubclass(cls, HostCausalLM) or cls.model_capabilities.get("pooling_model")  # encoders pool
        assert arch.startswith("TT") and on_frame, (arch, cls)


def test_every_tiny_recipe_belongs_to_one_family():
    pointers = [t for family in FAMILIES for t in family.tiny]
    assert len(pointers) == len(set(pointers))
    assert {t for t in pointers if not t.startswith("vllm_tt_testing.")} == set(ARCHITECTURES)
    for module in (t for t in pointers if t.startswith("vllm_tt_testing.")):
        importlib.import_module(module)


def test_an_architecture_two_families_claim_is_refused():
    one = HostFamily("pkg.a", {"TTX": "model:A"}, tiny=(), capabilities={"TTX": {}})
    other = HostFamily("pkg.b", {"TTX": "model:B"}, tiny=(), capabilities={"TTX": {}})
    with pytest.raises(ValueError, match="TTX is declared by pkg.a.model:A and pkg.b.model:B"):
        host_models([one, other])


def test_a_family_states_the_capabilities_of_exactly_its_models():
    with pytest.raises(ValueError, match=r"pkg.a: state the capabilities of exactly its models \['TTX'\], not \['TTY'\]"):
        HostFamily("pkg.a", {"TTX": "model:A"}, tiny=(), capabilities={"TTY": {}})


def test_a_new_dense_family_needs_only_its_class():
    """The walkthrough in docs/architecture.md: a dense family on the frame's layers names itself
    and nothing else; the frame reads its config (no Llama-style quirk applies to it)."""
    from transformers import AutoConfig

    class HostNewDenseForCausalLM(HostCausalLM):
        family = "new_dense"

    hf_config = AutoConfig.for_model("llama", num_hidden_layers=2, attention_bias=True)
    config = HostNewDenseForCausalLM.decoder_config(hf_config)
    assert (config.family, config.num_layers, config.qk_norm) == ("new_dense", 2, False)
    assert config.qkv_bias and config.o_bias
