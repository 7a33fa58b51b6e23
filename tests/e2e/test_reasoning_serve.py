"""Reasoning on one `vllm serve` of the host backend: `--reasoning-parser deepseek_r1` splits a chat
answer into `reasoning` and `content` at `</think>`, and a request's `thinking_token_budget` of N
ends the think section after N tokens by forcing `--reasoning-config`'s end string (a closing
phrase, then `</think>`; vLLM's own budget state, on the host sampling path), exactly as
transformers continues after those tokens; requests without a budget are unchanged and keep
sampling on the device.

The checkpoint is the tiny Llama with DeepSeek-R1's think markers, its chat template opening a
think section after the assistant tag (``vllm_tt_testing.tiny_reasoning``)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import pytest
from vllm_tt_testing.tiny_reasoning import THINK_END, THINK_START, cached_reasoning_checkpoint

from tests.e2e.helpers import hf_greedy, serve

pytestmark = pytest.mark.e2e

MAX_TOKENS = 16
FORCED_END = "\nTime is up.\n" + THINK_END
"""``--reasoning-config``'s ``reasoning_end_str``: what the budget forces, token by token."""
SERVE_ARGS = ("--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "256",
              "--reasoning-parser", "deepseek_r1", "--reasoning-config", json.dumps({"reasoning_end_str": FORCED_END}),
              "--additional-config.tt.sample_on_device_mode", "all")
MESSAGES = [{"role": "user", "content": "Once upon a time"}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return cached_reasoning_checkpoint()


@pytest.fixture(scope="module")
def tokenizer(model_dir) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def forced(tokenizer) -> list[int]:
    """The end string's tokens, ``</think>`` last (several: the forcing goes on for as many steps)."""
    ids = tokenizer.encode(FORCED_END, add_special_tokens=False)
    assert len(ids) > 2 and ids[-1] == tokenizer.convert_tokens_to_ids(THINK_END), ids
    return ids


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    import openai

    folder = tmp_path_factory.mktemp("reasoning")
    trace = folder / "sampling.jsonl"
    with serve(model_dir, *SERVE_ARGS, env={"TT_SAMPLING_TRACE": str(trace)}, log=folder / "serve.log") as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), trace


def budgeted_greedy(model_dir: Path, prompts: list[list[int]], budgets: list[int | None],
                    forced: list[int]) -> list[list[int]]:
    """What vLLM's budget gives prompts that end inside a think section: transformers' greedy
    tokens, with ``forced`` after ``budget`` of them and greedy again after it."""
    plain = hf_greedy(model_dir, prompts, MAX_TOKENS)
    for tokens, budget in zip(plain, budgets, strict=True):
        # A model that closed its think section by itself would leave the budget nothing to do.
        assert forced[-1] not in tokens[:budget], tokens
    cut = [(p, t[:b]) for p, t, b in zip(prompts, plain, budgets, strict=True) if b is not None]
    rest = iter(hf_greedy(model_dir, [p + think + forced for p, think in cut], MAX_TOKENS)) if cut else iter(())
    return [t if b is None else [*t[:b], *forced, *next(rest)][:MAX_TOKENS] for t, b in zip(plain, budgets, strict=True)]


def chat(client: Any, budget: int | None, tag: str, **kwargs: Any) -> Any:
    extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True, "request_id": tag}
    if budget is not None:
        extra["thinking_token_budget"] = budget
    return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                          extra_body=extra, **kwargs)


def reasoning_of(message: dict[str, Any]) -> str | None:
    """vLLM 0.33 names the field ``reasoning``; earlier releases ``reasoning_content``."""
    return message.get("reasoning", message.get("reasoning_content"))


def paths_of(trace: Path, tag: str) -> set[tuple[str, str]]:
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    return {(s["path"], s["reason"]) for s in steps if any(tag in r for r in s["requests"])}


def test_budget_ends_the_think_section_and_the_parser_splits_reasoning_from_content(server, model_dir, tokenizer,
                                                                                     forced):
    client, trace = server
    budget = 4
    result = chat(client, budget, "budget-4").model_dump()
    choice = result["choices"][0]
    prompt = result["prompt_token_ids"]
    assert prompt[-1] == tokenizer.convert_tokens_to_ids(THINK_START)  # the template opened the think section
    tokens = choice["token_ids"]
    assert tokens == budgeted_greedy(model_dir, [prompt], [budget], forced)[0]
    # deepseek_r1: the reasoning is the text before </think> (the closing phrase included).
    end = budget + len(forced) - 1
    message = choice["message"]
    assert reasoning_of(message) == tokenizer.decode(tokens[:end])
    assert message["content"] == tokenizer.decode(tokens[end + 1:])
    # Budgeted rows sample on the host, where vLLM's budget state lives; the reason is traced.
    assert paths_of(trace, "budget-4") == {("host", "thinking_budget")}


def test_without_a_budget_the_answer_is_all_reasoning_and_samples_on_the_device(server, model_dir, forced):
    client, trace = server
    result = chat(client, None, "no-budget").model_dump()
    choice = result["choices"][0]
    assert choice["token_ids"] == budgeted_greedy(model_dir, [result["prompt_token_ids"]], [None], forced)[0]
    # No </think>: deepseek_r1 reads the whole answer as reasoning (the think section never ended).
    assert choice["message"]["content"] is None
    assert reasoning_of(choice["message"])
    assert paths_of(trace, "no-budget") == {("device", "device")}


def test_streamed_reasoning_and_content_equal_the_plain_answer(server):
    client, _ = server
    plain = chat(client, 3, "stream-plain").choices[0].message.model_dump()
    reasoning, content = [], []
    for chunk in chat(client, 3, "stream", stream=True):
        if chunk.choices:
            delta = chunk.choices[0].delta.model_dump()
            reasoning.append(reasoning_of(delta) or "")
            content.append(delta.get("content") or "")
    assert ("".join(reasoning), "".join(content)) == (reasoning_of(plain), plain["content"])


def test_concurrent_budgets_each_end_on_time_beside_a_request_without_one(server, model_dir, tokenizer, forced):
    """Completions (token prompts ending in ``<think>``) with budgets 0, 2 and 6 and none, sent
    at once: each row's budget state follows its own slot."""
    client, _ = server
    start = tokenizer.convert_tokens_to_ids(THINK_START)
    prompts = [[5, 17, 300, 42, start], [8, 99, 512, start], [7, 64, 230, 11, start], [3, 44, 91, start]]
    budgets = [0, 2, None, 6]

    def complete(prompt: list[int], budget: int | None) -> list[int]:
        extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True}
        if budget is not None:
            extra["thinking_token_budget"] = budget
        result = client.completions.create(model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body=extra)
        return result.model_dump()["choices"][0]["token_ids"]

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        got = list(pool.map(complete, prompts, budgets))
    assert got == budgeted_greedy(model_dir, prompts, budgets, forced)

