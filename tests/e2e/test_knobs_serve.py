"""vLLM's own knobs on one `vllm serve` of the host backend: `--served-model-name` with two names,
`--enforce-eager` (said at startup as trace_mode none), `--no-enable-chunked-prefill` (every
prompt prefilled whole), `--no-async-scheduling`, `--max-logprobs`, `--seed`, `--tokenizer-mode`, `--generation-config`
with `--override-generation-config`, and `--scheduling-policy priority`: on a saturated server
high-priority requests reach their first token before the low-priority ones queued ahead of
them, in one lane and in lanes. Request fields: `n`, chat `top_logprobs` with
`max_completion_tokens`, `logprob_token_ids`, `response_format`."""

from __future__ import annotations

import concurrent.futures
import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import hf_greedy, serve, served_metric
from tests.e2e.test_sampling_serve import by_id, hf_log_softmax

pytestmark = pytest.mark.e2e

PROMPT = [5, 17, 300, 42, 8, 99, 512, 7, 64, 230]
LONG_PROMPT = [(i * 37 + 11) % 1000 + 3 for i in range(150)]
"""Longer than a prefill chunk would be (``--long-prefill-token-threshold``-free: whole)."""
MAX_LOGPROBS = 4
DEFAULT_NEW_TOKENS = 200
"""``--override-generation-config``'s max_new_tokens (the folder's generation config says 300):
vLLM's cap of a request's max_tokens."""
ROWS = 2
LOW, HIGH = 10, 0
"""vLLM's priority: the lower value is served first."""


def knob_args(generation_dir: Path) -> tuple[str, ...]:
    return ("--served-model-name", "tiny", "tiny-alias", "--max-num-seqs", str(ROWS), "--max-model-len", "512",
            "--max-num-batched-tokens", "512", "--no-enable-chunked-prefill", "--no-async-scheduling", "--enforce-eager",
            "--max-logprobs", str(MAX_LOGPROBS), "--seed", "7", "--tokenizer-mode", "hf",
            "--generation-config", str(generation_dir),
            "--override-generation-config", json.dumps({"max_new_tokens": DEFAULT_NEW_TOKENS}),
            "--scheduling-policy", "priority")


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def knob_server(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("knobs")
    generation = root / "generation"
    generation.mkdir()
    # top_k 1: requests that send no sampling fields are greedy by the folder's default.
    (generation / "generation_config.json").write_text(json.dumps({"top_k": 1, "max_new_tokens": 300}))
    log, trace = root / "serve.log", root / "steps.jsonl"
    with serve(model_dir, *knob_args(generation), env={"TT_STEP_TRACE": str(trace)}, log=log) as url:
        import openai

        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), url, log, trace


def complete(client: Any, model: str = "tiny", **kwargs: Any) -> dict[str, Any]:
    return client.completions.create(model=model, **kwargs).model_dump()


def test_both_served_names_answer_and_equal_transformers(knob_server, model_dir):
    client = knob_server[0]
    extra = {"ignore_eos": True, "return_token_ids": True}
    got = [complete(client, model=name, prompt=PROMPT, max_tokens=8, temperature=0, extra_body=extra)
           for name in ("tiny", "tiny-alias")]
    assert {r["model"] for r in got} == {"tiny"}  # vLLM answers with the first served name
    assert [r["choices"][0]["token_ids"] for r in got] == hf_greedy(model_dir, [PROMPT, PROMPT], 8)
    assert {m.id for m in client.models.list().data} == {"tiny", "tiny-alias"}


def test_enforce_eager_is_said_at_startup_and_runs_without_traces(knob_server):
    log = knob_server[2].read_text()
    assert "--enforce-eager: trace_mode none" in log
    assert "trace_mode=none" in log


def test_chunked_prefill_off_prefills_a_long_prompt_in_one_step(knob_server, model_dir):
    client, _, _, trace = knob_server
    result = complete(client, prompt=LONG_PROMPT, max_tokens=4, temperature=0,
                      extra_body={"ignore_eos": True, "return_token_ids": True})
    assert result["choices"][0]["token_ids"] == hf_greedy(model_dir, [LONG_PROMPT], 4)[0]
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    prefills = [max(s["scheduled"].values()) for s in steps if s["phase"] == "prefill" and s["scheduled"]]
    assert len(LONG_PROMPT) in prefills, prefills


def test_generation_config_defaults_apply_to_requests_without_them(knob_server, model_dir):
    client = knob_server[0]
    # No temperature: greedy by the folder's top_k 1; no max_tokens: the API's default of 16.
    result = complete(client, prompt=PROMPT, extra_body={"ignore_eos": True, "return_token_ids": True})
    assert result["choices"][0]["token_ids"] == hf_greedy(model_dir, [PROMPT], 16)[0]
    # A request's max_tokens below the override's cap wins; above it, the cap does (vLLM's rule).
    for asked, got in ((7, 7), (DEFAULT_NEW_TOKENS + 8, DEFAULT_NEW_TOKENS)):
        tokens = complete(client, prompt=PROMPT, max_tokens=asked, extra_body={"ignore_eos": True})
        assert tokens["usage"]["completion_tokens"] == got
    # response_format json_object constrains the text to JSON.
    shaped = complete(client, prompt="JSON:", max_tokens=24, temperature=0,
                      extra_body={"response_format": {"type": "json_object"}})
    assert shaped["choices"][0]["text"].lstrip().startswith(("{", "["))


def test_max_logprobs_bounds_requests_by_name(knob_server):
    import openai

    client = knob_server[0]
    ok = complete(client, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=MAX_LOGPROBS,
                  extra_body={"return_tokens_as_token_ids": True})
    assert all(len(top) >= MAX_LOGPROBS for top in ok["choices"][0]["logprobs"]["top_logprobs"])
    with pytest.raises(openai.BadRequestError, match="max"):
        complete(client, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=MAX_LOGPROBS + 1)
    assert complete(client, prompt=PROMPT, max_tokens=2, temperature=0)["usage"]["completion_tokens"] == 2


def test_chat_logprobs_and_max_completion_tokens(knob_server):
    client = knob_server[0]
    result = client.chat.completions.create(
        model="tiny-alias", messages=[{"role": "user", "content": "Hello there"}], max_completion_tokens=4,
        temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    assert result.usage.completion_tokens == 4
    content = result.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 3 for t in content)
    assert all(t.top_logprobs[0].logprob >= t.top_logprobs[-1].logprob for t in content)


def test_n_choices_are_each_a_seeded_sample(knob_server):
    client = knob_server[0]
    # top_k 0 lifts the generation config's default top_k 1.
    request = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "n": 3, "seed": 11,
               "extra_body": {"top_k": 0, "ignore_eos": True, "return_token_ids": True}}
    first, again = complete(client, **request), complete(client, **request)
    tokens = [c["token_ids"] for c in first["choices"]]
    assert len(tokens) == 3 and all(len(t) == 8 for t in tokens)
    assert tokens == [c["token_ids"] for c in again["choices"]]
    assert len({tuple(t) for t in tokens}) > 1


def test_logprob_token_ids_score_the_named_tokens(knob_server, model_dir):
    client = knob_server[0]
    named = [11, 222, 333]
    result = complete(client, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=1, extra_body={
        "ignore_eos": True, "return_token_ids": True, "logprob_token_ids": named,
        "return_tokens_as_token_ids": True})
    tokens = result["choices"][0]["token_ids"]
    reference = hf_log_softmax(model_dir, PROMPT + tokens)
    for k, top in enumerate(result["choices"][0]["logprobs"]["top_logprobs"]):
        scored = by_id(top)
        assert set(named) <= set(scored) <= {*named, tokens[k]}
        for tid, lp in scored.items():
            assert abs(lp - float(reference[len(PROMPT) - 1 + k][tid])) < 1e-3


# --- priority -------------------------------------------------------------------------------------

LOW_REQUESTS, HIGH_REQUESTS, LONG_DECODE = 8, 2, 200


def _waiting(url: str) -> float:
    return served_metric(url, "vllm:num_requests_waiting")


def _first_token_at(client: Any, priority: int, prompt: list[int]) -> float:
    """When (``time.monotonic()``) the stream's first token arrived."""
    stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=LONG_DECODE, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True, "priority": priority})
    first = None
    for chunk in stream:
        if first is None and chunk.choices:  # a token (its text may be empty: a partial character)
            first = time.monotonic()
    assert first is not None
    return first


def assert_high_priority_goes_first(client: Any, url: str, queued: int) -> None:
    """Saturate the server with low-priority streams until ``queued`` of them wait, then send the
    high-priority ones: their first tokens all come before the median first token of the low
    streams that had not started when they were sent (the queued ones; in lanes a high request
    waits for a row of its own lane, so the comparison is with the median, not the first).
    Without priority the high requests queue behind those low ones and the check fails."""
    prompts = [[(i * 13 + j) % 900 + 3 for j in range(12)] for i in range(LOW_REQUESTS + HIGH_REQUESTS)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        lows = [pool.submit(_first_token_at, client, LOW, p) for p in prompts[:LOW_REQUESTS]]
        deadline = time.monotonic() + 60
        while _waiting(url) < queued:  # the precondition: a saturated server with a queue
            assert time.monotonic() < deadline, "the low-priority requests never queued"
            time.sleep(0.05)
        sent = time.monotonic()
        highs = [pool.submit(_first_token_at, client, HIGH, p) for p in prompts[LOW_REQUESTS:]]
        low, high = [f.result() - sent for f in lows], [f.result() - sent for f in highs]
    waited = [t for t in low if t > 0]
    assert len(waited) >= queued, (low, queued)
    assert max(high) < statistics.median(waited), (high, low)


def test_high_priority_requests_start_first_on_a_saturated_server(knob_server):
    client, url = knob_server[:2]
    assert_high_priority_goes_first(client, url, queued=LOW_REQUESTS - ROWS - 2)


LANES = 2


@pytest.fixture
def lane_server(model_dir, tmp_path):
    # Every program takes at least 20 ms: the tiny model decodes a low stream in a few ms a token
    # otherwise, and the queued lows could all have started before a busy API server forwards
    # the high requests (seen: every first token ~1.5 s after they were sent).
    args = ("--served-model-name", "tiny", "--data-parallel-size", str(LANES), "--max-num-seqs", str(ROWS // 2),
            "--api-server-count", "1", "--max-model-len", "512", "--scheduling-policy", "priority",
            "--additional-config.tt.host_device_time", "20ms")
    with serve(model_dir, *args, env={"MESH_DEVICE": "TG"}, log=tmp_path / "serve.log") as url:
        import openai

        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), url, tmp_path / "serve.log"


def test_high_priority_requests_start_first_in_lanes(lane_server):
    client, url, log = lane_server
    assert f"{LANES} lanes x {ROWS // 2} rows" in log.read_text()
    assert_high_priority_goes_first(client, url, queued=LOW_REQUESTS - ROWS - 2)
