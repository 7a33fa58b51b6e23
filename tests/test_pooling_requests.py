"""Per-request checks of a pooling server: generation is refused by name, an input longer than
the longest pooling shape is a 400 naming the limit and the option that raises it."""

from __future__ import annotations

import pytest
from vllm.pooling_params import PoolingParams
from vllm.sampling_params import SamplingParams
from vllm_tt_models_registry.contract import ModelCapabilities
from vllm_tt_platform.config.request_checks import (
    RequestRules,
    TTUnsupportedRequestError,
    check_pooling_prompt,
    check_request,
)

POOLING = RequestRules.of("TTBertModel", ModelCapabilities(pooling_model=True), pooling_max_len=96)
GENERATION = RequestRules.of("TTLlamaForCausalLM", ModelCapabilities())


def test_a_generation_request_to_a_pooling_model_is_refused_by_name() -> None:
    with pytest.raises(TTUnsupportedRequestError, match="TTBertModel is a pooling model.*/v1/embeddings"):
        check_request(SamplingParams(), POOLING)


def test_a_pooling_request_passes_a_pooling_model() -> None:
    check_request(PoolingParams(task="embed"), POOLING)


def test_an_input_past_the_longest_shape_names_the_limit_and_the_option() -> None:
    check_pooling_prompt({"prompt_token_ids": list(range(96))}, POOLING)
    with pytest.raises(TTUnsupportedRequestError, match=r"97 tokens.*\(96 tokens\).*tt\.pooling_shapes"):
        check_pooling_prompt({"prompt_token_ids": list(range(97))}, POOLING)


def test_generation_models_have_no_pooling_limit() -> None:
    check_pooling_prompt({"prompt_token_ids": list(range(4096))}, GENERATION)
