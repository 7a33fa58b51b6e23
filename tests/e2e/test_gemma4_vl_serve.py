"""Gemma 4 vision-language (``TTGemma4ForConditionalGeneration``) through ``vllm serve`` on the
host mesh backend: vLLM's own Gemma 4 processor cuts each image into patches (``pixel_values``,
``pixel_position_ids``) and expands its one image token into begin marker, as many image tokens
as the image's pooled grid and end marker; the runner hands the patches to the host model's
prefill (Gemma 4 vision tower with its 2D rotary, pooling and embedder; the E-series text side
with KV-shared layers and per-layer inputs; images attended both ways on the sliding layers).

One engine start, in lane mode (2 lanes of 4 rows, as the other VL serve tests), with an
80-token step budget, so that prompts with images (81 and 147 tokens, an image 66 of them) are
prefilled in several chunks: concurrent OpenAI chat requests with base64 ``image_url`` data URLs
(text only, one and two images, square and wide) equal transformers' generate() token for
token, prompt ids included; the image decides the answer; the step trace shows that no chunk
ended inside an image. A long one-image prompt sent twice is served from the prefix cache past
its image (vLLM then sends no pixels for it). Corrupt image bytes, a third image, audio and video are refused with a
400 and the next request is served.

And one ``vllm.LLM`` engine (``generate`` with ``multi_modal_data``) on 4 rows, an 80-token step
budget and a KV pool of 20 blocks: seven mixed requests side by side, prefilled in chunks that
never end inside an image, some preempted mid-prefill; then four image requests with long
answers, preempted while decoding and resumed (vLLM prefills prompt and answer again with the
images: sliding and full pages re-made, the KV-shared layers and per-layer inputs again). Every
answer equals transformers'."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached_gemma4_vl

from tests.e2e import vl_chat
from tests.e2e.helpers import serve
from tests.e2e.vl_chat import (
    BAD_REQUESTS,
    assert_every_lane_prefilled_an_image,
    chat_body,
    image_parts,
    lane_serve,
)
from tests.e2e.vl_offline import GEMMA_STEP_BUDGET, assert_gemma_rounds_equal_hf

pytestmark = pytest.mark.e2e

REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (2, 3), (3,), (1, 0), (2,)]
"""Image kinds per request (square images); each request its own salt, so its own pixels."""
WIDE_REQUESTS: list[tuple[int, ...]] = [(0,), (3, 1)]
"""Image kinds of the requests with wide (32x64) images: 55 image tokens each."""
WIDE = (32, 64)
MAX_TOKENS = 16
LONG_QUESTION = " ".join([vl_chat.QUESTION] * 16)
"""With one image this question makes a prompt whose full KV blocks reach past the image."""


@pytest.fixture(scope="module")
def checkpoint():
    return cached_gemma4_vl()


@pytest.fixture(scope="module")
def hf_vl(checkpoint):
    return vl_chat.load_hf(checkpoint)


def hf_generate(hf_vl, kinds: tuple[int, ...], salt: int, size: tuple[int, int] = (32, 32),
                question: str = vl_chat.QUESTION) -> tuple[list[int], list[int]]:
    """HF's (prompt ids, greedy tokens) as the chat endpoint renders the prompt (bos from the template)."""
    return vl_chat.hf_generate(hf_vl, kinds, MAX_TOKENS, salt, nested=True, add_special_tokens=False, size=size,
                               question=question)


LONG_REQUESTS: list[tuple[int, ...]] = [(0,), (2, 1), (3,), (1,)]


def test_llm_generate_with_images_equals_transformers_chunked_and_preempted(checkpoint, hf_vl, tmp_path):
    by_kinds = assert_gemma_rounds_equal_hf(checkpoint, hf_vl, tmp_path / "steps.jsonl", REQUESTS, LONG_REQUESTS,
                                            MAX_TOKENS)
    assert len({tuple(by_kinds[(k,)]) for k in range(4)}) == 4 and by_kinds[(1,)] != by_kinds[()]


def prefill_ends(trace: Path) -> dict[str, list[int]]:
    """Per request id (vLLM's, with its suffix), where each of its prefill passes ended, counted
    from its first computed token, read from the lane coordinator's step trace."""
    ends: dict[str, list[int]] = {}
    for line in trace.read_text().splitlines():
        step = json.loads(line)
        if step["phase"] == "prefill":
            for lane in step["lanes"]:
                for rid, tokens in lane["scheduled"].items():
                    done = ends.setdefault(rid, [])
                    done.append((done[-1] if done else 0) + tokens)
    return ends


def test_serve_chat_with_base64_images_equals_transformers(checkpoint, hf_vl, tmp_path):
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = lane_serve(4, trace)
    with serve(checkpoint, "--max-model-len", "256", *lane_args, "--max-num-batched-tokens", str(GEMMA_STEP_BUDGET),
               "--limit-mm-per-prompt", '{"image": 2, "video": 0}', "--enable-prompt-tokens-details", env=lane_env,
               log=log) as url:

        def chat(parts: list[dict[str, Any]], question: str = vl_chat.QUESTION) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, MAX_TOKENS, question),
                              timeout=300)

        batch = [image_parts(kinds, 5 + i) for i, kinds in enumerate(REQUESTS)]
        batch += [image_parts(kinds, 20 + i, WIDE) for i, kinds in enumerate(WIDE_REQUESTS)]
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            answers = list(pool.map(chat, batch))
        repeated = [chat(image_parts((1,), 13), LONG_QUESTION) for _ in range(2)]
        refusals, after = {}, {}
        for name, parts in BAD_REQUESTS.items():
            refusals[name] = chat(parts or image_parts((0, 1, 2), 9))
            after[name] = chat(image_parts((2,), 11))  # the engine keeps serving
    for response in [*answers, *repeated, *after.values()]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    want = [hf_generate(hf_vl, kinds, 5 + i) for i, kinds in enumerate(REQUESTS)]
    want += [hf_generate(hf_vl, kinds, 20 + i, WIDE) for i, kinds in enumerate(WIDE_REQUESTS)]
    bodies = [response.json() for response in answers]
    assert [b["prompt_token_ids"] for b in bodies] == [w[0] for w in want], "vLLM's expanded prompt ids equal HF's"
    got = [b["choices"][0]["token_ids"] for b in bodies]
    sent = [*REQUESTS, *(("wide", *k) for k in WIDE_REQUESTS)]
    mismatches = [(k, g, w[1]) for k, g, w in zip(sent, got, want, strict=True) if g != w[1]]
    assert not mismatches, mismatches

    by_kinds = dict(zip(REQUESTS, got[: len(REQUESTS)], strict=True))
    singles = [by_kinds[(k,)] for k in range(4)]
    assert len({tuple(a) for a in singles}) == 4, singles  # the image decides the answer
    assert by_kinds[(1,)] != by_kinds[()]
    image_token = hf_vl[0].config.image_token_id
    assert [[stop - first for first, stop in vl_chat.image_runs(b["prompt_token_ids"], image_token)]
            for b in bodies[len(REQUESTS):]] == [[55], [55, 55]]

    ends = prefill_ends(trace)
    chunked = 0
    for body in bodies:
        prompt = body["prompt_token_ids"]
        cached_tokens = (body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        passes = [[cached_tokens + e for e in done] for rid, done in ends.items() if rid.startswith(body["id"])]
        assert len(passes) == 1 and passes[0][-1] == len(prompt), (body["id"], passes, cached_tokens)
        cuts = [e for e in passes[0] for first, stop in vl_chat.image_runs(prompt, image_token) if first < e < stop]
        assert not cuts, (passes[0], vl_chat.image_runs(prompt, image_token))
        chunked += len(passes[0]) > 1
    assert chunked >= 3, "the prompts with images were prefilled in chunks"
    assert_every_lane_prefilled_an_image(trace, log, 4, len(want[REQUESTS.index(())][0]))

    prompt, tokens = hf_generate(hf_vl, (1,), 13, question=LONG_QUESTION)
    assert [r.json()["prompt_token_ids"] for r in repeated] == [prompt, prompt]
    assert [r.json()["choices"][0]["token_ids"] for r in repeated] == [tokens, tokens]
    cached_tokens = repeated[1].json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    last_image_token = max(i for i, t in enumerate(prompt) if t == image_token)
    assert cached_tokens > last_image_token, (cached_tokens, last_image_token, len(prompt))

    expected_after = hf_generate(hf_vl, (2,), 11)[1]
    assert all(r.json()["choices"][0]["token_ids"] == expected_after for r in after.values())
    for name, response in refusals.items():
        assert response.status_code == 400, (name, response.status_code, response.text)
        assert response.json()["error"]["message"], name
    assert "At most 2 image(s)" in refusals["three images"].json()["error"]["message"]
    assert "At most 0 video(s)" in refusals["video"].json()["error"]["message"]
