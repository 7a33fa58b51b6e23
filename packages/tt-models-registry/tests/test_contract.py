"""The model contract: tt-metal-shaped classes are accepted, anything short of it is refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from vllm_tt_models_registry.contract import (
    CALLS,
    OPTIONAL_METHODS,
    REQUIRED_METHODS,
    ContractError,
    ModelCapabilities,
    TTModel,
    TTModelExtras,
    check_model_class,
)


@pytest.fixture
def generator_cls(adapter_source: Callable[..., str]) -> type:
    """A class written the way tt-metal's generator_vllm classes are."""
    namespace: dict[str, Any] = {}
    exec(adapter_source("LlamaForCausalLM"), namespace)
    return namespace["LlamaForCausalLM"]


def test_tt_metal_style_class_is_accepted(generator_cls: type) -> None:
    caps = check_model_class(generator_cls, owner="test")
    assert caps == ModelCapabilities(
        supports_prefix_caching=True, supports_async_decode=True, supports_sample_on_device=True
    )


def test_protocol_itself_satisfies_the_checked_call_shapes() -> None:
    check_model_class(TTModel, owner="protocol")
    for name in OPTIONAL_METHODS:
        assert hasattr(TTModelExtras, name), name


def test_call_shapes_cover_required_and_optional_members() -> None:
    assert set(CALLS) == set(REQUIRED_METHODS) | set(OPTIONAL_METHODS)


@pytest.mark.parametrize(
    "member", ["initialize_vllm_model", "prefill_forward", "decode_forward", "allocate_kv_cache"]
)
def test_missing_required_method_is_refused(generator_cls: type, member: str) -> None:
    # no base class: the Generator base would otherwise still provide decode_forward
    stripped = type("Stripped", (), {k: v for k, v in vars(generator_cls).items() if k != member})
    with pytest.raises(ContractError) as info:
        check_model_class(stripped, owner="bundle X")
    assert info.value.owner == "bundle X"
    assert f"has no method {member}()" in info.value.problem
    assert member in info.value.fix


def test_per_layer_allocation_stands_in_for_allocate_kv_cache(generator_cls: type) -> None:
    body = {k: v for k, v in vars(generator_cls).items() if k != "allocate_kv_cache"}
    body["allocate_kv_cache_per_layer"] = lambda self, per_layer_specs: []
    check_model_class(type("PerLayer", generator_cls.__bases__, body), owner="t")


def test_initialize_must_be_a_classmethod(generator_cls: type) -> None:
    def initialize_vllm_model(self, hf_config, mesh_device, max_batch_size, **kwargs):
        return None

    broken = type("Broken", (generator_cls,), {"initialize_vllm_model": initialize_vllm_model})
    with pytest.raises(ContractError, match="initialize_vllm_model must be a classmethod") as info:
        check_model_class(broken, owner="t")
    assert "@classmethod" in info.value.fix


def test_optional_class_level_hooks_must_be_classmethods(generator_cls: type) -> None:
    broken = type("Broken", (generator_cls,), {"get_kv_cache_spec": lambda self, vllm_config: None})
    with pytest.raises(ContractError, match="get_kv_cache_spec must be a classmethod"):
        check_model_class(broken, owner="t")


def test_method_that_cannot_take_the_runner_keywords_is_refused(generator_cls: type) -> None:
    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens):
        return None

    broken = type("Broken", (generator_cls,), {"prefill_forward": prefill_forward})
    with pytest.raises(ContractError) as info:
        check_model_class(broken, owner="t")
    assert "prefill_forward" in info.value.problem
    assert "start_pos" in info.value.problem
    assert "**kwargs" in info.value.fix


def test_initialize_must_accept_the_loader_keywords(generator_cls: type) -> None:
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len):
        return None

    broken = type("Broken", (generator_cls,), {"initialize_vllm_model": initialize_vllm_model})
    with pytest.raises(ContractError, match="tt_data_parallel"):
        check_model_class(broken, owner="t")


def test_sample_on_device_needs_sampling_params(generator_cls: type) -> None:
    def decode_forward(self, tokens, start_pos, page_table, kv_cache, enable_trace, read_from_device):
        return None

    strict = {"decode_forward": decode_forward}
    plain = type("Plain", (generator_cls,), {**strict, "model_capabilities": {}})
    check_model_class(plain, owner="t")  # no device sampling: sampling_params is never passed
    sampling = type(
        "Sampling", (generator_cls,), {**strict, "model_capabilities": {"supports_sample_on_device": True}}
    )
    with pytest.raises(ContractError, match="supports_sample_on_device") as info:
        check_model_class(sampling, owner="t")
    assert "sampling_params" in info.value.problem


def test_async_decode_needs_read_decode_output() -> None:
    class NoReader:
        model_capabilities = {"supports_async_decode": True}

        @classmethod
        def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, **kwargs):
            return cls()

        def allocate_kv_cache(self, shape, dtype, num_layers):
            return []

        def prefill_forward(self, **kwargs):
            return None

        def decode_forward(self, **kwargs):
            return None

    with pytest.raises(ContractError, match="read_decode_output"):
        check_model_class(NoReader, owner="t")
    NoReader.model_capabilities = {}
    check_model_class(NoReader, owner="t")


def test_model_drafts_need_propose_drafts(generator_cls: type) -> None:
    drafting = type("Drafting", (generator_cls,), {"model_capabilities": {"max_model_drafts": 3}})
    with pytest.raises(ContractError, match="max_model_drafts but has no method propose_drafts") as info:
        check_model_class(drafting, owner="t")
    assert "propose_drafts(tokens=..., start_pos=..., page_table=..., kv_cache=..., num_drafts=...)" in info.value.fix

    def propose_drafts(self, tokens, start_pos, page_table, kv_cache, num_drafts, **kwargs):
        return None

    drafting.propose_drafts = propose_drafts
    assert check_model_class(drafting, owner="t").max_model_drafts == 3


def test_overrides_win_over_class_capabilities(generator_cls: type) -> None:
    caps = check_model_class(
        generator_cls, owner="t", overrides={"single_program_lanes": True, "supports_prefix_caching": False}
    )
    assert caps.single_program_lanes and not caps.supports_prefix_caching
    assert caps.supports_async_decode  # kept from the class


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("yes", "must be a dict"),
        ({"supports_async_decode": "yes"}, "must be true or false"),
        ({"max_device_top_k": 3.5}, "must be an int"),
        ({"max_device_top_k": True}, "must be an int"),
        ({"prefill_trace_lens": [128, 0]}, "positive ints"),
        ({"kv_cache_kinds": ["paged"]}, "kv_cache_kinds.*full_attention, sliding_window, mla, recurrent_state"),
        ({"kv_cache_kinds": []}, "non-empty list"),
        ({"modalities": ["speech"]}, r"modalities'\] must be a non-empty list of image, video, audio"),
        ({"modalities": []}, "non-empty list"),
        ({"mixed_shapes": [[4, 0]]}, r"mixed_shapes'\] must be a list of \[decode_rows, chunk_tokens\] pairs"),
        ({"mixed_shapes": [[4]]}, "pairs of positive ints"),
        ({"mixed_shapes": [4, 32]}, "pairs of positive ints"),
    ],
)
def test_bad_class_capabilities_name_the_class(generator_cls: type, raw: Any, match: str) -> None:
    broken = type("Broken", (generator_cls,), {"model_capabilities": raw})
    with pytest.raises(ContractError, match=match) as info:
        check_model_class(broken, owner="bundle B")
    assert "class Broken.model_capabilities" in str(info.value)
    assert str(info.value).startswith("bundle B: ")


def test_kv_cache_kinds_default_to_full_attention_and_keep_one_order() -> None:
    assert ModelCapabilities().kv_cache_kinds == ("full_attention",)
    caps = ModelCapabilities.from_mapping({"kv_cache_kinds": ["sliding_window", "full_attention"]}, owner="t")
    assert caps.kv_cache_kinds == ("full_attention", "sliding_window")
    schema = ModelCapabilities.json_schema()["properties"]["kv_cache_kinds"]
    assert schema["items"]["enum"] == ["full_attention", "sliding_window", "mla", "recurrent_state", "cross_attention"]


def test_modalities_default_to_images_and_keep_one_order() -> None:
    assert ModelCapabilities().modalities == ("image",)
    assert ModelCapabilities.from_mapping({"modalities": ["audio", "video", "image"]}, owner="t").modalities == (
        "image", "video", "audio")
    assert ModelCapabilities.json_schema()["properties"]["modalities"]["items"]["enum"] == ["image", "video", "audio"]


def test_mixed_shapes_default_to_none_and_parse_as_sorted_pairs(generator_cls: type) -> None:
    assert ModelCapabilities().mixed_shapes == ()
    caps = ModelCapabilities.from_mapping({"mixed_shapes": [[8, 64], (4, 32), [4, 32]]}, owner="t")
    assert caps.mixed_shapes == ((4, 32), (8, 64))
    pair = ModelCapabilities.json_schema()["properties"]["mixed_shapes"]["items"]
    assert (pair["minItems"], pair["maxItems"], pair["items"]["minimum"]) == (2, 2, 1)
    # Declaring shapes needs the call that runs them.
    broken = type("NoMixed", (generator_cls,), {"model_capabilities": {"mixed_shapes": [[4, 32]]}})
    with pytest.raises(ContractError, match=r"declares mixed_shapes but has no method mixed_forward\(\)"):
        check_model_class(broken, owner="t")


def test_unknown_class_capability_keys_are_ignored() -> None:
    caps = ModelCapabilities.from_mapping(
        {"supports_chunked_prefill": True, "prefill_trace_lens": [256, 128]}, owner="t"
    )
    assert caps.prefill_trace_lens == (128, 256)


def test_non_class_is_refused() -> None:
    with pytest.raises(ContractError, match="is not a class"):
        check_model_class(object(), owner="t")


def test_capabilities_json_schema_lists_every_field() -> None:
    schema = ModelCapabilities.json_schema()
    assert set(schema["properties"]) == set(ModelCapabilities.__dataclass_fields__)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["single_program_lanes"] == {"type": "boolean"}


def test_optional_member_that_is_not_callable_is_refused(generator_cls: type) -> None:
    broken = type("Broken", (generator_cls,), {"read_decode_output": 3})
    with pytest.raises(ContractError, match="Broken.read_decode_output is not a method"):
        check_model_class(broken, owner="t")


class _Encoder:
    """A pooling model: no decode, no KV cache."""

    model_capabilities = {"pooling_model": True}

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: Any, max_batch_size: int, **kwargs: Any) -> Any:
        return cls()

    def pool_forward(self, tokens: Any, prompt_lens: Any, enable_trace: bool = False, **kwargs: Any) -> Any:
        return tokens

    def warmup_model_pool(self, shapes: Any, enable_trace: bool) -> None:
        pass


def test_pooling_model_needs_no_decode_or_kv_cache() -> None:
    assert check_model_class(_Encoder, owner="test").pooling_model


def test_pooling_model_without_pool_forward_is_refused() -> None:
    stripped = type("NoPool", (), {k: v for k, v in vars(_Encoder).items() if k != "pool_forward"})
    with pytest.raises(ContractError) as info:
        check_model_class(stripped, owner="bundle P")
    assert "has no method pool_forward()" in info.value.problem
    assert "every TT pooling model implements initialize_vllm_model, pool_forward" in info.value.fix


def test_pool_forward_must_take_the_runner_keywords() -> None:
    def pool_forward(self: Any, tokens: Any) -> Any:
        return tokens

    bad = type("BadPool", (), {**dict(vars(_Encoder)), "pool_forward": pool_forward})
    with pytest.raises(ContractError, match="pool_forward"):
        check_model_class(bad, owner="bundle P")
