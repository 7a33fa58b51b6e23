"""Speculative decoding in lane mode (issue 19): `vllm serve` on the host backend emulating a Galaxy
(TG), ``--data-parallel-size 4`` folded into 4 lanes of 2 rows, n-gram drafts with K=3.

Each lane's rows get their own drafts (vLLM's ``NgramProposer`` per row, routed to the row's lane
by the lane coordinator), and a verify step is one decode step over every lane's rows. Concurrent
greedy clients get exactly transformers' tokens, vLLM's accepted-draft counter moves, and the
startup log names the method, K and the verify trace shape per lane. Each lane has a small KV
pool (4 blocks of 64 tokens for its 2 rows), so long answers preempt rows with drafts in flight
in every lane, and the tokens are still transformers'.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    assert_greedy_equal,
    concurrent_greedy,
    hf_greedy,
    repetitive_prompts,
    serve,
    served_metric,
)

pytestmark = pytest.mark.e2e

LANES, ROWS, K = 4, 2, 3
MAX_NEW_TOKENS = 24
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
SERVE_ARGS = ("--served-model-name", "tiny", "--data-parallel-size", str(LANES), "--max-num-seqs", str(ROWS),
              # one engine process (the lanes) needs one API server
              "--api-server-count", "1", "--max-model-len", "256", "--speculative-config", json.dumps(SPEC),
              # 4 usable KV blocks of 64 tokens per lane (one is vLLM's null block): two rows growing
              # past 128 tokens do not fit, so every lane preempts
              "--num-gpu-blocks-override", "5",
              # every program takes at least 20 ms, so the concurrent requests overlap on the engine
              # even when a loaded machine hands them over slowly (else no lane ever fills up)
              "--additional-config.tt.host_device_time", "20ms")


@pytest.fixture(scope="module")
def lane_server(tiny_checkpoint, tmp_path_factory):
    model_dir = tiny_checkpoint("llama")
    folder = tmp_path_factory.mktemp("spec_lanes")
    log, trace = folder / "serve.log", folder / "steps.jsonl"
    with serve(model_dir, *SERVE_ARGS, env={"MESH_DEVICE": "TG", "TT_STEP_TRACE": str(trace)}, log=log) as url:
        yield model_dir, url, log, trace


def test_concurrent_greedy_in_lanes_equals_transformers(lane_server):
    model_dir, url, _, _ = lane_server
    from transformers import AutoTokenizer

    prompts = repetitive_prompts(AutoTokenizer.from_pretrained(model_dir).vocab_size)  # 8: every lane's rows
    expected = hf_greedy(model_dir, prompts, MAX_NEW_TOKENS)
    before = served_metric(url, "vllm:spec_decode_num_accepted_tokens_total")
    got = concurrent_greedy(url, prompts, MAX_NEW_TOKENS)
    assert_greedy_equal(prompts, got, expected)
    accepted = served_metric(url, "vllm:spec_decode_num_accepted_tokens_total") - before
    drafted = served_metric(url, "vllm:spec_decode_num_draft_tokens_total")
    assert accepted <= drafted, (accepted, drafted)
    # more than one lane's rows could have accepted: the counter covers every lane
    assert accepted > ROWS * MAX_NEW_TOKENS, accepted


def preemptions_per_lane(trace: Path) -> Counter[int]:
    """Rows each lane preempted, from the coordinator's step trace (``lanes[i].preempted``)."""
    per_lane: Counter[int] = Counter()
    for line in trace.read_text().splitlines():
        for lane, part in enumerate(json.loads(line).get("lanes", [])):
            per_lane[lane] += len(part["preempted"])
    return per_lane


def test_preemption_in_lanes_with_drafts_in_flight_stays_exact(lane_server):
    """Eight rows, two per lane, each growing to three KV blocks in a lane pool of four: every
    lane preempts rows that carry drafts (vLLM drops their drafts and frees their KV) and later
    recomputes them, drafts are accepted meanwhile, and every output is transformers'."""
    model_dir, url, _, trace = lane_server
    from transformers import AutoTokenizer

    prompts = repetitive_prompts(AutoTokenizer.from_pretrained(model_dir).vocab_size)  # 30-90 tokens
    max_tokens = 110
    expected = hf_greedy(model_dir, prompts, max_tokens)
    preempted = preemptions_per_lane(trace)
    accepted = served_metric(url, "vllm:spec_decode_num_accepted_tokens_total")
    got = concurrent_greedy(url, prompts, max_tokens)
    assert_greedy_equal(prompts, got, expected)
    assert served_metric(url, "vllm:spec_decode_num_accepted_tokens_total") > accepted
    lanes_preempting = [lane for lane, n in (preemptions_per_lane(trace) - preempted).items() if n > 0]
    assert len(lanes_preempting) >= 2, preemptions_per_lane(trace)


def test_log_names_speculation_per_lane(lane_server):
    _, _, log, _ = lane_server
    text = Path(log).read_text()
    assert "TT lane coordinator: 4 lanes x 2 rows" in text
    assert (f"speculation ngram, K={K}, verify trace [{ROWS} rows, {1 + K}] per lane x {LANES} lanes, "
            "verified on the host;") in text
