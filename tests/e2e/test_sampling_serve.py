"""Sampling end to end through `vllm serve` on the host backend with device sampling on, driven
by the OpenAI client: seeded requests keep their tokens across runs, batch compositions and the
host fallback; greedy equals host-sampled greedy; host-only features are honoured; logprobs and
prompt logprobs match transformers; every decision lands in the sampling trace."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import hf_greedy, serve

pytestmark = pytest.mark.e2e

PROMPT = [5, 17, 300, 42, 8, 99, 512, 7, 64, 230]
LONG_PROMPT = [(i * 37 + 11) % 1000 + 3 for i in range(150)]
"""Longer than the per-step token budget below: its prefill (and its prompt logprobs) is chunked."""
BUDGET = 64
SEEDED = {"temperature": 0.8, "top_p": 0.9, "seed": 1234,
          "extra_body": {"top_k": 20, "ignore_eos": True, "return_token_ids": True}}
GREEDY = {"temperature": 0.0, "extra_body": {"ignore_eos": True, "return_token_ids": True}}
SERVE_ARGS = ("--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512",
              "--max-num-batched-tokens", str(BUDGET), "--additional-config.tt.sample_on_device_mode", "all",
              # An untrained model would otherwise fill a JSON answer with whitespace.
              "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}')


def complete(client: Any, prompt: list[int] = PROMPT, max_tokens: int = 12, **kwargs: Any) -> dict[str, Any]:
    """One completion as a plain dict (vLLM's extra fields included)."""
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, **kwargs).model_dump()


def with_extra(base: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {**base, "extra_body": {**base.get("extra_body", {}), **extra}}


def token_ids(result: dict[str, Any]) -> list[int]:
    return result["choices"][0]["token_ids"]


MIXED_TRIES = 5


def concurrently(client: Any, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(lambda kw: complete(client, **kw), requests))


def client_for(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused")


@pytest.fixture(scope="module")
def model_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def host_run(model_dir, tmp_path_factory) -> dict[str, list[int]]:
    """A server that samples every batch on the host (always_compat_sampling): the seeded and
    greedy requests' tokens. The server is stopped before the device-sampling one starts."""
    log = tmp_path_factory.mktemp("serve-host") / "serve.log"
    with serve(model_dir, *SERVE_ARGS, "--additional-config.tt.always_compat_sampling", "true", log=log) as url:
        client = client_for(url)
        return {"seeded": token_ids(complete(client, **SEEDED)), "greedy": token_ids(complete(client, **GREEDY))}


@pytest.fixture(scope="module")
def device_server(model_dir, host_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve-device")
    trace = folder / "sampling.jsonl"
    with serve(model_dir, *SERVE_ARGS, env={"TT_SAMPLING_TRACE": str(trace)}, log=folder / "serve.log") as url:
        yield client_for(url), trace


def trace_steps(trace: Path, request_tag: str | None = None) -> list[dict[str, Any]]:
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    if request_tag is None:
        return steps
    return [s for s in steps if any(request_tag in r for r in s["requests"])]


# --- seeded requests -----------------------------------------------------------------------------


def test_seeded_request_is_the_same_alone_batched_fallen_back_and_on_the_host(device_server, host_run):
    client, trace = device_server
    alone = token_ids(complete(client, **with_extra(SEEDED, request_id="seeded-alone")))
    assert len(alone) == 12
    assert token_ids(complete(client, **SEEDED)) == alone  # again: same tokens
    assert host_run["seeded"] == alone  # the host path (every batch on the host) agrees
    assert {s["path"] for s in trace_steps(trace, "seeded-alone")} == {"device"}

    # Four concurrent clients form one batch only if they arrive together, which a loaded
    # machine (a parallel suite) does not always give: every try must keep the seeded tokens,
    # and one of at most MIXED_TRIES must have run the four in one batch.
    widest = 0
    for attempt in range(MIXED_TRIES):
        tag = f"seeded-mixed-{attempt}"
        mixed = concurrently(client, [
            with_extra(SEEDED, request_id=tag),
            GREEDY,
            {"temperature": 1.0, "extra_body": {"top_k": 5, "ignore_eos": True}},
            {"temperature": 0.7, "seed": 5, "presence_penalty": 0.5, "frequency_penalty": 0.3,
             "extra_body": {"top_k": 10, "ignore_eos": True}},
        ])
        assert token_ids(mixed[0]) == alone
        steps = trace_steps(trace, tag)
        assert {s["path"] for s in steps} == {"device"}
        widest = max(widest, *(len(s["requests"]) for s in steps))
        if widest == 4:
            break
    assert widest == 4, f"the mixed batch was never formed in {MIXED_TRIES} tries"

    # The same for the two requests whose batch falls back to the host sampler.
    for attempt in range(MIXED_TRIES):
        tag = f"seeded-fallback-{attempt}"
        fallen = concurrently(client, [
            with_extra(SEEDED, request_id=tag),
            {"temperature": 1.0, "extra_body": {"min_p": 0.05, "ignore_eos": True}},
        ])
        assert token_ids(fallen[0]) == alone
        if any(s["phase"] == "decode" and s["path"] == "host" and s["reason"] == "min_p"
               and len(s["requests"]) == 2 for s in trace_steps(trace, tag)):
            break
    else:
        raise AssertionError(f"the batch never fell back to the host in {MIXED_TRIES} tries")


def test_unseeded_sampling_varies(device_server):
    client, _ = device_server
    request = {"temperature": 1.0, "max_tokens": 8, "extra_body": {"top_k": 20, "ignore_eos": True,
                                                                    "return_token_ids": True}}
    outputs = {tuple(token_ids(r)) for r in concurrently(client, [request] * 4)}
    outputs |= {tuple(token_ids(complete(client, **request))) for _ in range(2)}
    assert len(outputs) >= 3


# --- greedy --------------------------------------------------------------------------------------


def test_greedy_on_device_equals_host_sampled_greedy_and_transformers(device_server, host_run, model_dir):
    client, trace = device_server
    greedy = token_ids(complete(client, **with_extra(GREEDY, request_id="greedy-device")))
    assert greedy == host_run["greedy"]
    assert greedy == hf_greedy(model_dir, [PROMPT], 12)[0]
    assert {s["path"] for s in trace_steps(trace, "greedy-device")} == {"device"}


# --- host-only features --------------------------------------------------------------------------


def single_token_word(model_dir: Path) -> tuple[str, set[int]]:
    """A word vLLM tokenises to one token with and without a leading space, and those ids."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for token in range(10, tokenizer.vocab_size):
        word = tokenizer.decode([token]).strip()
        variants = [tokenizer.encode(w, add_special_tokens=False) for w in (word, " " + word)]
        if word.isalpha() and len(word) >= 3 and all(len(ids) == 1 for ids in variants):
            return word, {ids[0] for ids in variants}
    raise AssertionError("the tiny tokenizer has no single-token word")


def test_bad_words_are_never_generated(device_server, model_dir):
    client, trace = device_server
    word, ids = single_token_word(model_dir)
    forced = {"logit_bias": {str(i): 30 for i in ids}, **GREEDY}
    assert set(token_ids(complete(client, **forced))) <= ids  # the bias alone picks the word
    out = token_ids(complete(client, **with_extra(forced, bad_words=[word], request_id="bad-words")))
    assert len(out) == 12 and not ids & set(out)
    assert {s["reason"] for s in trace_steps(trace, "bad-words")} == {"bad_words"}


def test_logit_bias_forces_its_token(device_server):
    client, _ = device_server
    out = token_ids(complete(client, logit_bias={"7": 100}, **GREEDY))
    assert out == [7] * 12


def test_allowed_token_ids_bound_every_token(device_server):
    client, _ = device_server
    allowed = [10, 11, 12, 13]
    out = token_ids(complete(client, **with_extra(SEEDED, allowed_token_ids=allowed)))
    assert len(out) == 12 and set(out) <= set(allowed)


def test_min_tokens_holds_back_a_stop_token(device_server):
    client, _ = device_server
    stop = {"logit_bias": {"9": 100}, **with_extra(GREEDY, stop_token_ids=[9])}
    assert token_ids(complete(client, **stop)) == [9]
    held = complete(client, **with_extra(stop, min_tokens=5))
    assert held["choices"][0]["finish_reason"] == "stop"
    assert len(token_ids(held)) == 6 and 9 not in token_ids(held)[:5] and token_ids(held)[5] == 9


def test_json_schema_is_honoured(device_server):
    client, trace = device_server
    schema = {"type": "object", "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                                               "ok": {"type": "boolean"}},
              "required": ["color", "ok"], "additionalProperties": False}
    result = complete(client, prompt="The answer as JSON:", max_tokens=40, **with_extra(
        GREEDY, ignore_eos=False, request_id="json-schema", structured_outputs={"json": schema}))
    value = json.loads(result["choices"][0]["text"])
    assert set(value) == {"color", "ok"} and value["color"] in ("red", "green", "blue")
    assert isinstance(value["ok"], bool)
    assert {s["reason"] for s in trace_steps(trace, "json-schema")} == {"structured_output"}


# --- logprobs ------------------------------------------------------------------------------------


def hf_log_softmax(model_dir: Path, ids: list[int]):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].log_softmax(-1)


def by_id(top: dict[str, float]) -> dict[int, float]:
    """``{"token_id:5": lp}`` (return_tokens_as_token_ids) -> ``{5: lp}``."""
    return {int(key.split(":", 1)[1]): value for key, value in top.items()}


@pytest.mark.parametrize(("num_logprobs", "path"), [(0, "device"), (5, "host")])
def test_logprobs_match_transformers(device_server, model_dir, num_logprobs, path):
    client, trace = device_server
    tag = f"logprobs-{num_logprobs}"
    result = complete(client, logprobs=num_logprobs, **with_extra(
        SEEDED, return_tokens_as_token_ids=True, request_id=tag))
    tokens = token_ids(result)
    logprobs = result["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == len(tokens) == 12
    reference = hf_log_softmax(model_dir, PROMPT + tokens)
    for k, (token, value, top) in enumerate(zip(tokens, logprobs["token_logprobs"], logprobs["top_logprobs"],
                                                strict=True)):
        expected = reference[len(PROMPT) - 1 + k]
        assert abs(value - float(expected[token])) < 1e-3
        top = by_id(top)
        assert token in top and len(top) in ({1} if num_logprobs == 0 else {num_logprobs, num_logprobs + 1})
        best = expected.topk(num_logprobs).indices.tolist() if num_logprobs else []
        assert set(best) <= set(top)
        for tid, lp in top.items():
            assert abs(lp - float(expected[tid])) < 1e-3
    decode_paths = {s["path"] for s in trace_steps(trace, tag) if s["phase"] == "decode"}
    assert decode_paths == {path}


def test_prompt_logprobs_match_transformers_across_chunks(device_server, model_dir):
    client, trace = device_server
    result = complete(client, prompt=LONG_PROMPT, max_tokens=2, **with_extra(
        GREEDY, prompt_logprobs=3, request_id="prompt-logprobs"))
    prompt_logprobs = result["choices"][0]["prompt_logprobs"]
    assert len(prompt_logprobs) == len(LONG_PROMPT) and prompt_logprobs[0] is None
    reference = hf_log_softmax(model_dir, LONG_PROMPT)
    for position in range(1, len(LONG_PROMPT)):
        entry = {int(k): v for k, v in prompt_logprobs[position].items()}
        expected = reference[position - 1]
        target = LONG_PROMPT[position]
        assert target in entry and len(entry) in (3, 4)
        assert set(expected.topk(3).indices.tolist()) <= set(entry)
        for tid, value in entry.items():
            assert abs(value["logprob"] - float(expected[tid])) < 1e-3
    prefills = [s for s in trace_steps(trace, "prompt-logprobs") if s["phase"] == "prefill"]
    assert len(prefills) >= 3 and {s["path"] for s in prefills} == {"host"}
    assert prefills[-1]["reason"] == "prompt_logprobs"  # earlier chunks: intermediate_chunk
    assert token_ids(result) == hf_greedy(model_dir, [LONG_PROMPT], 2)[0]


# --- decisions -----------------------------------------------------------------------------------


def test_every_step_has_a_decision_with_a_reason(device_server):
    from vllm_tt_sampling.decision import REASONS

    client, trace = device_server
    complete(client, max_tokens=2, temperature=1.0, extra_body={"min_p": 0.05})
    steps = trace_steps(trace)
    assert steps and all(s["reason"] in REASONS and s["path"] in ("device", "host") for s in steps)
    assert {"device", "min_p"} <= {s["reason"] for s in steps}
