"""The model's own speculation in lanes and over the prefix cache (issue 31 item 4): adaptive
block output (``tt.block_tokens 4``) and the model's own drafter (``--speculative-config method
custom_class``, K = 3), each through ``vllm serve`` of the trained tiny llama on
``MESH_DEVICE=TG`` in 2 lanes of 4 rows (a 20 ms program floor so concurrent requests overlap).

A request alone commits drafts (block output: fewer decode steps than tokens; the drafter: vLLM
counts accepted drafts); eight concurrent greedy requests, plain and streamed, equal
transformers token for token while both lanes decode them; a 70-token prompt sent a second time is served from the prefix cache
(its first two 32-token blocks) and still equals transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import served_metric
from tests.e2e.spec_checks import (
    GREEDY,
    SELF_DRAFTING_TEXTS,
    complete,
    concurrently,
    self_drafting_server,
    settled_decode_steps,
    stream,
)

pytestmark = pytest.mark.e2e

MAX_NEW_TOKENS = 16
LONG = " ".join(["the lane coordinator runs one phase for all lanes"] * 8)
"""A prompt of more than two 32-token KV blocks."""


def _mode_args(mode: str) -> tuple[str, ...]:
    if mode == "block output":
        return ("--additional-config.tt.block_tokens", "4")
    from vllm_tt_platform.config.startup_checks import MODEL_DRAFTS

    return ("--speculative-config", json.dumps({"method": "custom_class", "model": MODEL_DRAFTS,
                                                "num_speculative_tokens": 3}))


@pytest.fixture(scope="module", params=["block output", "model drafts"])
def server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("self-drafting-lanes")
    trace = root / "steps.jsonl"
    with self_drafting_server("llama", root / "serve.log", MAX_NEW_TOKENS, *_mode_args(request.param),
                              "--data-parallel-size", "2", "--api-server-count", "1",
                              "--additional-config.tt.host_device_time", "20ms",
                              texts=(*SELF_DRAFTING_TEXTS, LONG),
                              env={"MESH_DEVICE": "TG", "TT_STEP_TRACE": str(trace)}) as (url, prompts, expected):
        yield url, prompts, expected, root, request.param


def _decoded_per_lane(trace: Path) -> list[int]:
    """Decode tokens each lane was scheduled, over the step trace."""
    per_lane = [0, 0]
    for line in trace.read_text().splitlines():
        step = json.loads(line)
        if step["phase"] == "decode":
            for lane, part in enumerate(step["lanes"]):
                per_lane[lane] += sum(part["scheduled"].values())
    return per_lane


def test_a_request_alone_commits_drafts(server):
    url, prompts, expected, _, mode = server
    steps, accepted = settled_decode_steps(url), served_metric(url, "vllm:spec_decode_num_accepted_tokens_total")
    got = complete(url, prompts[0], max_tokens=MAX_NEW_TOKENS, **GREEDY)["choices"][0]["token_ids"]
    assert got == expected[0]
    if mode == "block output":  # one token from the prefill, then blocks of 1 to 4
        assert settled_decode_steps(url) - steps < MAX_NEW_TOKENS - 1
    else:
        assert served_metric(url, "vllm:spec_decode_num_accepted_tokens_total") > accepted


def test_concurrent_requests_equal_transformers_in_both_lanes(server):
    url, prompts, expected, root, _ = server
    short, want = prompts[:4] * 2, expected[:4] * 2
    plain = concurrently(lambda p: complete(url, p, max_tokens=MAX_NEW_TOKENS, **GREEDY), [(p,) for p in short])
    streamed = concurrently(lambda p: stream(url, p, max_tokens=MAX_NEW_TOKENS, **GREEDY), [(p,) for p in short])
    assert [r["choices"][0]["token_ids"] for r in plain] == want
    assert [ids for _, ids in streamed] == want
    assert "2 lanes x 4 rows" in (root / "serve.log").read_text()
    assert min(_decoded_per_lane(root / "steps.jsonl")) > 0


def test_a_repeated_prompt_is_served_from_the_prefix_cache(server):
    url, prompts, expected, *_ = server
    assert len(prompts[-1]) > 64
    first = complete(url, prompts[-1], max_tokens=MAX_NEW_TOKENS, **GREEDY)
    hits = served_metric(url, "vllm:prefix_cache_hits_total")
    second = complete(url, prompts[-1], max_tokens=MAX_NEW_TOKENS, **GREEDY)
    assert first["choices"][0]["token_ids"] == second["choices"][0]["token_ids"] == expected[-1]
    assert served_metric(url, "vllm:prefix_cache_hits_total") - hits >= 64
