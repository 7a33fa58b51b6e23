"""The request-field table (``config.request_surface``) against the installed vLLM's own request
schemas: a field a new vLLM release adds fails here, by name, until it is classified; each
"works" names a test that exists and each "refused" a check that exists."""

from __future__ import annotations

import pytest
from vllm_tt_platform.config.request_surface import REQUEST_SURFACE
from vllm_tt_platform.config.surface import Support, unresolved

from tests.test_serve_surface import ROOT, defines_check, defines_test


def request_schemas() -> dict[str, list[str]]:
    """The public fields of vLLM's completion and chat request models and of ``SamplingParams``
    (the OpenAI protocol modules were split per endpoint in 0.33)."""
    from vllm.sampling_params import SamplingParams

    try:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    except ImportError:  # vLLM 0.31, 0.32
        from vllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest  # type: ignore
    return {
        "CompletionRequest": list(CompletionRequest.model_fields),
        "ChatCompletionRequest": list(ChatCompletionRequest.model_fields),
        "SamplingParams": [f for f in SamplingParams.__struct_fields__ if not f.startswith("_")],
    }


@pytest.mark.parametrize("schema", ["CompletionRequest", "ChatCompletionRequest", "SamplingParams"])
def test_every_request_field_of_the_installed_vllm_has_one_class(schema):
    fields = request_schemas()[schema]
    assert fields, schema
    assert unresolved(fields, REQUEST_SURFACE) == []


def test_a_field_the_table_does_not_know_fails_by_name():
    assert unresolved(["temperature", "tt_planted_field"], REQUEST_SURFACE) == ["tt_planted_field: unclassified"]


@pytest.mark.parametrize("entry", [e for e in REQUEST_SURFACE if e.support is Support.WORKS], ids=lambda e: e.proof)
def test_every_works_entry_names_a_test_that_exists(entry):
    assert defines_test(ROOT, entry.proof), entry.proof


def test_every_refused_entry_names_a_check_that_exists():
    # One test over the class, not one per entry: no request field is refused today (the last,
    # thinking_token_budget, is applied by the host sampler since), and an empty parameter set
    # would be a skipped test.
    refused = [e.proof for e in REQUEST_SURFACE if e.support is Support.REFUSED]
    assert [proof for proof in refused if not defines_check(proof)] == []
