"""The model's own drafter through ``vllm serve`` (``--speculative-config method custom_class``
naming ``ModelDrafts``; issue 31 item 4), one server: the trained tiny llama drafts 3 tokens per
row with its own first layers (``propose_drafts``) after every step, and vLLM's verify steps
check them.

Greedy outputs equal transformers' token for token, alone, 4 rows at once and streamed, with
drafts accepted (vLLM's own acceptance counter); ``max_tokens``, a stop token and stop strings
end the output exactly; the startup summary says who drafts."""

from __future__ import annotations

import json

import pytest

from tests.e2e.spec_checks import (
    GREEDY,
    accepted_drafts,
    assert_stop_strings_exact,
    complete,
    concurrently,
    self_drafting_server,
    stream,
)

pytestmark = pytest.mark.e2e

K = 3
MAX_NEW_TOKENS = 40  # past position 32: drafts run into the lookahead block reserved for them


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from vllm_tt_platform.config.startup_checks import MODEL_DRAFTS

    spec = json.dumps({"method": "custom_class", "model": MODEL_DRAFTS, "num_speculative_tokens": K})
    log = tmp_path_factory.mktemp("model_drafts") / "serve.log"
    with self_drafting_server("llama", log, MAX_NEW_TOKENS, "--speculative-config", spec) as (url, prompts, expected):
        yield url, prompts, expected, log


def test_greedy_outputs_equal_transformers_with_the_models_own_drafts_accepted(server):
    url, prompts, expected, log = server
    before = accepted_drafts(url)
    alone = complete(url, prompts[0], max_tokens=MAX_NEW_TOKENS, **GREEDY)
    assert alone["choices"][0]["token_ids"] == expected[0]
    plain = concurrently(lambda p: complete(url, p, max_tokens=MAX_NEW_TOKENS, **GREEDY), [(p,) for p in prompts])
    streamed = concurrently(lambda p: stream(url, p, max_tokens=MAX_NEW_TOKENS, **GREEDY), [(p,) for p in prompts])
    assert [r["choices"][0]["token_ids"] for r in plain] == expected
    assert [ids for _, ids in streamed] == expected
    assert accepted_drafts(url) > before
    assert f"custom_class, K={K}" in log.read_text() and "drafted by the model itself" in log.read_text()


def test_max_tokens_stop_tokens_and_stop_strings_are_exact(server):
    url, prompts, expected, _ = server
    for n in (1, 2, 5):
        assert complete(url, prompts[0], max_tokens=n, **GREEDY)["choices"][0]["token_ids"] == expected[0][:n]
    stop = expected[1][5]
    params = {**GREEDY, "extra_body": {**GREEDY["extra_body"], "stop_token_ids": [stop]}}
    got = complete(url, prompts[1], max_tokens=MAX_NEW_TOKENS, **params)["choices"][0]["token_ids"]
    assert got == expected[1][: expected[1].index(stop) + 1]
    assert_stop_strings_exact(url, prompts)
