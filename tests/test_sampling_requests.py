"""Per-request sampling checks: what neither sampling path honours is rejected on arrival, with
an error vLLM's API server turns into HTTP 400."""

from __future__ import annotations

import pytest
from vllm.exceptions import VLLMClientError
from vllm.sampling_params import SamplingParams
from vllm_tt_models_registry.contract import ModelCapabilities
from vllm_tt_platform.config import request_checks
from vllm_tt_platform.config.request_checks import (
    RequestRules,
    TTUnsupportedRequestError,
    check_images,
    check_request,
)

WITH = RequestRules(arch="TTWithForCausalLM", prompt_logprobs=True)
WITHOUT = RequestRules(arch="TTWithoutForCausalLM", prompt_logprobs=False)


@pytest.fixture
def installed():
    """Install rules for one test, restoring whatever the process had."""
    before = request_checks._installed
    yield request_checks.install
    if before is not None:
        request_checks.install(before)
    else:
        request_checks._installed = None


def test_rules_come_from_the_capability_flag():
    assert RequestRules.of("X", ModelCapabilities(supports_prompt_logprobs=True)).prompt_logprobs
    assert not RequestRules.of("X", ModelCapabilities()).prompt_logprobs


def test_prompt_logprobs_need_the_capability():
    params = SamplingParams(prompt_logprobs=2)
    check_request(params, WITH)
    with pytest.raises(TTUnsupportedRequestError, match="TTWithoutForCausalLM.*supports_prompt_logprobs") as err:
        check_request(params, WITHOUT)
    assert isinstance(err.value, VLLMClientError) and err.value.parameter == "prompt_logprobs"
    check_request(SamplingParams(), WITHOUT)


def test_thinking_token_budget_is_served_whatever_the_model():
    # The host sampler applies it (vLLM's budget state); vLLM's front end refuses it by name
    # when the server runs without --reasoning-parser / --reasoning-config.
    params = SamplingParams(thinking_token_budget=64)
    for rules in (WITH, WITHOUT, None):
        check_request(params, rules)


def test_platform_validate_request_uses_the_installed_rules(installed):
    from vllm_tt_platform.platform import TTPlatform

    installed(WITHOUT)
    with pytest.raises(TTUnsupportedRequestError, match="prompt_logprobs"):
        TTPlatform.validate_request(None, SamplingParams(prompt_logprobs=1))
    installed(WITH)
    TTPlatform.validate_request(None, SamplingParams(prompt_logprobs=1))


def test_a_pooling_request_is_refused_by_name():
    from vllm.pooling_params import PoolingParams
    from vllm_tt_platform.errors import TTUnsupportedFeatureError
    from vllm_tt_platform.platform import TTPlatform

    with pytest.raises(TTUnsupportedFeatureError, match="PoolingParams.*--runner pooling"):
        TTPlatform.validate_request(None, PoolingParams())


@pytest.fixture
def no_prompt_logprobs_bundle(tmp_path, monkeypatch) -> None:
    """A bundle serving Llama checkpoints with a model that returns only last-position logits."""
    bundle = tmp_path / "bundles" / "last_logits_llama"
    bundle.mkdir(parents=True)
    (bundle / "vllm_metadata.json").write_text(
        '{"arch": "LlamaForCausalLM", "main_class": "last_logits_adapter:LastLogitsLlama"}'
    )
    (bundle / "last_logits_adapter.py").write_text(
        "from vllm_tt_host.models.families import HostLlamaForCausalLM\n\n"
        "class LastLogitsLlama(HostLlamaForCausalLM):\n"
        "    model_capabilities = {**HostLlamaForCausalLM.model_capabilities,\n"
        "                          'supports_prompt_logprobs': False}\n"
    )
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tmp_path / "bundles"))


def test_configure_installs_the_served_models_rules(tiny_checkpoint, installed, monkeypatch):
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("TT_MESH_BACKEND", "host")
    EngineArgs(model=str(tiny_checkpoint("llama")), max_model_len=256).create_engine_config()
    assert request_checks._installed == RequestRules("TTLlamaForCausalLM", prompt_logprobs=True)


def test_configure_installs_rules_of_a_model_without_prompt_logprobs(
    tiny_checkpoint, installed, no_prompt_logprobs_bundle, monkeypatch
):
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("TT_MESH_BACKEND", "host")
    EngineArgs(model=str(tiny_checkpoint("llama")), max_model_len=256).create_engine_config()
    assert request_checks._installed.prompt_logprobs is False
    with pytest.raises(TTUnsupportedRequestError, match="prompt_logprobs"):
        check_request(SamplingParams(prompt_logprobs=0))


def test_allowed_token_ids_with_structured_outputs_is_refused():
    # Found by tests/e2e/test_request_fuzz.py: HTTP 500 once the grammar rejected the only
    # allowed token.
    from vllm.sampling_params import StructuredOutputsParams

    constrained = SamplingParams(allowed_token_ids=[5, 6], structured_outputs=StructuredOutputsParams(json_object=True))
    with pytest.raises(TTUnsupportedRequestError, match="allowed_token_ids cannot be combined") as err:
        check_request(constrained, WITH)
    assert isinstance(err.value, VLLMClientError) and err.value.parameter == "allowed_token_ids"
    check_request(SamplingParams(allowed_token_ids=[5, 6]), WITH)
    check_request(SamplingParams(structured_outputs=StructuredOutputsParams(regex="[ab]+")), WITH)


def test_an_image_longer_than_one_prefill_pass_is_refused():
    """Images are never split over prefill chunks, so vLLM could never schedule a longer one:
    refused in the front end, naming the span, the limit and the flag."""
    from vllm.multimodal.inputs import PlaceholderRange

    rules = RequestRules("TTGemma3ForConditionalGeneration", prompt_logprobs=False, image_tokens_per_pass=48)
    fits = {"mm_placeholders": {"image": [PlaceholderRange(offset=4, length=18), PlaceholderRange(30, 48)]}}
    check_images(fits, rules)
    too_long = {"mm_placeholders": {"image": [PlaceholderRange(offset=4, length=18), PlaceholderRange(30, 70)]}}
    with pytest.raises(TTUnsupportedRequestError, match=r"image 1 of the request spans 70 prompt tokens.*\(48.*"
                                                        r"--max-num-batched-tokens of at least 70"):
        check_images(too_long, rules)
    check_images(too_long, RequestRules("TTLlamaForCausalLM", prompt_logprobs=True))  # not multimodal
    check_images({"prompt_token_ids": [1, 2]}, rules)  # a text-only request
