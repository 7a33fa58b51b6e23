"""Request fuzzing through `vllm serve`: generated OpenAI completion and chat requests (right and
wrong types, out-of-range values, every sampling parameter, unicode, unknown fields) must get
HTTP 200 or a 4xx that says what is wrong - never a 5xx - and the server keeps serving.

One server per sampling mode (device sampling on and off). The default test command runs a
short pass (``TT_FUZZ_EXAMPLES``, 12 requests per mode); ``nox -s fuzz`` (100) is the full
pass (docs/reliability.md). A failing request found here stays as an ``@example``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from vllm_tt_host.tiny import TOKENIZER_VOCAB

from tests.e2e.helpers import serve

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("TT_FUZZ_EXAMPLES", "12"))
MAX_MODEL_LEN = 256
VOCAB = TOKENIZER_VOCAB
"""The tiny checkpoint's vocabulary size: token ids at and past it are out of range."""
MODES = {
    "device-sampling": ("--additional-config.tt.sample_on_device_mode", "all"),
    "host-sampling": (),
}

# Values of every JSON type, for fields given the wrong one.
junk = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
unicode_text = st.text(st.characters(codec="utf-8"), max_size=40)
valid_id = st.integers(0, VOCAB - 1)
token_id = st.integers(-3, VOCAB + 3) | st.sampled_from([2**31, 2**63, -(2**63)])
odd_float = st.floats(-3, 3) | st.sampled_from([0.0, 1e-9, 1e30, -1e30, math.inf, -math.inf, math.nan])
odd_count = st.integers(-2, 0) | st.sampled_from([2**31, 10**12, 21])
prompt = st.one_of(
    unicode_text, st.just(""), st.just([]), st.lists(token_id, min_size=1, max_size=24),
    st.lists(unicode_text, min_size=1, max_size=3), st.lists(st.lists(token_id, max_size=8), min_size=1, max_size=2),
)
schema = st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "string", "maxLength": 4}, {"type": "nonsense"}, {},
])


def field(valid: st.SearchStrategy[Any], edge: st.SearchStrategy[Any]
          ) -> tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]:
    """A field's values inside vLLM's documented range, and at or past its edges."""
    return valid, edge


SAMPLING = {
    "temperature": field(st.floats(0, 2), odd_float), "top_p": field(st.floats(0.01, 1), odd_float),
    "top_k": field(st.integers(-1, VOCAB + 10), st.integers(-5, -2) | st.just(2**40)),
    "min_p": field(st.floats(0, 1), odd_float),
    "presence_penalty": field(st.floats(-2, 2), odd_float), "frequency_penalty": field(st.floats(-2, 2), odd_float),
    "repetition_penalty": field(st.floats(0.1, 2), odd_float),
    "seed": field(st.integers(0, 2**63 - 1), st.integers(-(2**64), -1) | st.just(2**64)),
    "stop": field(st.lists(st.text(max_size=3), max_size=3) | st.text(max_size=3),
                  st.just("") | st.just([""]) | st.lists(unicode_text, max_size=8)),
    "stop_token_ids": field(st.lists(valid_id, max_size=3), st.lists(token_id, min_size=1, max_size=3)),
    "logit_bias": field(st.dictionaries(valid_id.map(str), st.floats(-100, 100), max_size=4),
                        st.dictionaries(token_id.map(str) | st.text(max_size=4),
                                        st.floats(-1e3, 1e3) | st.sampled_from([math.nan, 1e300]), min_size=1,
                                        max_size=3)),
    "n": field(st.integers(1, 3), odd_count), "min_tokens": field(st.integers(0, 8), odd_count),
    "ignore_eos": field(st.booleans(), st.booleans()),
    "allowed_token_ids": field(st.lists(valid_id, min_size=1, max_size=4), st.lists(token_id, max_size=4)),
    "bad_words": field(st.lists(st.text(max_size=4), max_size=2), st.lists(unicode_text, max_size=2)),
    "response_format": field(
        st.sampled_from([{"type": "text"}, {"type": "json_object"}])
        | schema.map(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}),
        st.sampled_from([{"type": "xml"}, {}, {"type": "json_schema"}]),
    ),
    "structured_outputs": field(st.sampled_from([{"regex": "[ab]{1,3}"}, {"choice": ["yes", "no"]}]),
                                st.sampled_from([{"json": {}}, {}, {"regex": "("}, {"choice": []}])),
    "prompt_logprobs": field(st.integers(0, 3), odd_count),
    "skip_special_tokens": field(st.booleans(), st.booleans()),
    "include_stop_str_in_output": field(st.booleans(), st.booleans()),
    "stream": field(st.booleans(), st.booleans()), "user": field(st.text(max_size=5), unicode_text),
}
max_tokens = field(st.integers(1, 32), st.sampled_from([0, -1, MAX_MODEL_LEN, MAX_MODEL_LEN + 1, 2**31, 10**15]))
COMPLETION = {
    **SAMPLING, "max_tokens": max_tokens,
    "prompt": field(st.text(max_size=30) | st.lists(valid_id, min_size=1, max_size=24)
                    | st.lists(st.lists(valid_id, min_size=1, max_size=8), min_size=1, max_size=2),
                    prompt | st.lists(valid_id, min_size=MAX_MODEL_LEN - 8, max_size=MAX_MODEL_LEN + 8)),
    "logprobs": field(st.integers(0, 5), odd_count), "best_of": field(st.integers(1, 2), odd_count),
    "echo": field(st.booleans(), st.booleans()), "suffix": field(st.text(max_size=4), unicode_text),
}
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"])},
    optional={"content": st.text(max_size=30), "name": st.text(max_size=5)},
)
odd_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "tool", "robot", ""])},
    optional={"content": unicode_text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": unicode_text}),
                                                 max_size=2) | junk,
              "name": unicode_text},
)
CHAT = {
    **SAMPLING, "max_tokens": max_tokens, "max_completion_tokens": max_tokens,
    "messages": field(st.lists(message, min_size=1, max_size=3), st.lists(odd_message, max_size=3)),
    "logprobs": field(st.booleans(), junk), "top_logprobs": field(st.integers(0, 5), odd_count),
}


@st.composite
def body(draw: st.DrawFn, fields: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]], required: str) -> dict[str, Any]:
    """A request for the served model (now and then another), ``required`` mostly present, and
    a few other fields, mostly inside their range; sometimes one field has a wrong type, now
    and then a field vLLM does not know."""
    payload: dict[str, Any] = {"model": draw(st.sampled_from(["tiny"] * 19 + ["not-served"]))}
    keys = sorted(draw(st.sets(st.sampled_from(sorted(set(fields) - {required})), max_size=6)))
    if draw(st.integers(0, 19)):
        keys.insert(0, required)
    for key in keys:
        valid, edge = fields[key]
        payload[key] = draw(valid if draw(st.integers(0, 4)) else edge)
    if keys and not draw(st.integers(0, 4)):
        payload[draw(st.sampled_from(keys))] = draw(junk)
    if not draw(st.integers(0, 14)):
        payload[draw(st.sampled_from(["frobnicate", "", "max_tokens ", "Temperature"]))] = draw(junk)
    return payload


request = st.one_of(
    body(COMPLETION, "prompt").map(lambda b: ("/v1/completions", b)),
    body(CHAT, "messages").map(lambda b: ("/v1/chat/completions", b)),
)


def check_answer(path: str, status: int, text: str) -> None:
    """200 with a result, or a 4xx naming the problem; never a 5xx (a streamed 200 may still
    carry an error event, which must not be a server error either)."""
    assert status < 500, f"{path}: {status} {text[:2000]}"
    if status >= 400:
        error = json.loads(text)["error"]
        assert error["message"], text
        return
    assert status == 200, text[:2000]
    if text.startswith("data:"):
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", text[-2000:]
        for event in events[:-1]:
            chunk = json.loads(event)
            if "error" in chunk:
                assert chunk["error"].get("code", 400) < 500, event
    else:
        assert "choices" in json.loads(text), text[:2000]


def send(url: str, path: str, payload: dict[str, Any]) -> tuple[int, str]:
    # json.dumps writes NaN and Infinity as bare words (not JSON): the server must refuse them.
    content = json.dumps(payload, ensure_ascii=False).encode("utf-8", "surrogatepass")
    response = httpx.post(f"{url}{path}", content=content, timeout=120,
                          headers={"Content-Type": "application/json"})
    return response.status_code, response.text


@pytest.fixture(scope="module", params=list(MODES))
def server(request: pytest.FixtureRequest, tiny_checkpoint: Any, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[str]:
    log = tmp_path_factory.mktemp("fuzz") / f"{request.param}.log"
    with serve(tiny_checkpoint("llama"), "--served-model-name", "tiny", "--max-num-seqs", "4",
               "--max-model-len", str(MAX_MODEL_LEN), *MODES[request.param], log=log, timeout=480) as url:
        yield url
        assert_still_serving(url, log)


def assert_still_serving(url: str, log: Path) -> None:
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200, log
    status, text = send(url, "/v1/completions", {"model": "tiny", "prompt": "The river", "max_tokens": 4})
    assert status == 200 and json.loads(text)["choices"][0]["text"], (status, text, log)


@settings(max_examples=EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=request)
# Found by this test: HTTP 500 when the grammar allowed none of the allowed_token_ids (now a 400).
@example(case=("/v1/completions", {"model": "tiny", "prompt": "0", "allowed_token_ids": [0],
                                   "structured_outputs": {"json": {}}}))
@example(case=("/v1/completions", {"model": "tiny", "prompt": "0", "allowed_token_ids": [5, 6],
                                   "response_format": {"type": "json_object"}}))
def test_every_request_gets_a_result_or_a_client_error(server: str, case: tuple[str, dict[str, Any]]) -> None:
    path, payload = case
    status, text = send(server, path, payload)
    event(f"{path} {status}")  # --hypothesis-show-statistics: how many reached the engine
    check_answer(path, status, text)
