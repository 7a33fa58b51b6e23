"""Adaptive block output through ``vllm serve`` and the OpenAI client (issue 31 item 4), one
server: the trained tiny llama with ``--additional-config.tt.block_tokens 4`` drafts with its own
first layers and verifies inside ``decode_forward``, committing 1 to 4 tokens per row per decode
step.

Greedy outputs equal transformers' token for token, streamed or not, alone and 4 rows at once, in
fewer decode steps than tokens (the TT step counter says so); ``max_tokens`` and a stop token
inside a block end the output exactly; a stop string ends the text right before it although the
block ran past it."""

from __future__ import annotations

import pytest

from tests.e2e.spec_checks import (
    GREEDY,
    assert_stop_strings_exact,
    complete,
    concurrently,
    self_drafting_server,
    settled_decode_steps,
    stream,
)

pytestmark = pytest.mark.e2e

BLOCK = 4
MAX_NEW_TOKENS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    log = tmp_path_factory.mktemp("block_output") / "serve.log"
    with self_drafting_server("llama", log, MAX_NEW_TOKENS, "--additional-config.tt.block_tokens", str(BLOCK)) as served:
        yield served


def test_greedy_blocks_equal_transformers_in_fewer_steps_than_tokens(server):
    url, prompts, expected = server
    before = settled_decode_steps(url)
    alone = complete(url, prompts[0], max_tokens=MAX_NEW_TOKENS, **GREEDY)
    steps = settled_decode_steps(url) - before
    assert alone["choices"][0]["token_ids"] == expected[0]
    # A plain decode step commits one token: the first comes from the prefill, 19 decode steps
    # would follow. Blocks commit several.
    assert 0 < steps < MAX_NEW_TOKENS - 1, steps
    plain = concurrently(lambda p: complete(url, p, max_tokens=MAX_NEW_TOKENS, **GREEDY), [(p,) for p in prompts])
    streamed = concurrently(lambda p: stream(url, p, max_tokens=MAX_NEW_TOKENS, **GREEDY), [(p,) for p in prompts])
    assert [r["choices"][0]["token_ids"] for r in plain] == expected
    assert [ids for _, ids in streamed] == expected
    assert [text for text, _ in streamed] == [r["choices"][0]["text"] for r in plain]


def test_max_tokens_and_stop_tokens_inside_a_block_are_exact(server):
    url, prompts, expected = server
    for n in (1, 3, 5):  # 3 and 5 end inside a block of 4
        assert complete(url, prompts[0], max_tokens=n, **GREEDY)["choices"][0]["token_ids"] == expected[0][:n]
    stop = expected[1][5]
    params = {**GREEDY, "extra_body": {**GREEDY["extra_body"], "stop_token_ids": [stop]}}
    got = complete(url, prompts[1], max_tokens=MAX_NEW_TOKENS, **params)["choices"][0]["token_ids"]
    assert got == expected[1][: expected[1].index(stop) + 1]


def test_stop_strings_end_the_text_exactly(server):
    url, prompts, _ = server
    assert_stop_strings_exact(url, prompts)
