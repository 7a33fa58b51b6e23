"""Gemma 4 Unified (``TTGemma4UnifiedForConditionalGeneration``) through ``vllm serve`` on the host
mesh backend: vLLM's own Gemma 4 Unified processor merges each 3x3 square of patches into one
model patch and expands each image into as many image tokens; the host model embeds every merged
patch on its own (no vision tower) into the Gemma 4 text decoder, whose image tokens see their
whole image on every layer (past the sliding window too).

One engine start in lane mode (``MESH_DEVICE=TG``, 2 lanes of 4 rows, a 20 ms program floor, as
the other VL serve tests) with an 80-token step budget (the image prompts are prefilled in
several chunks; the host model refuses a chunk that cuts an image or starts inside one reaching
past its window): concurrent OpenAI chat requests with base64 images
(text only, one and two square images, a wide one) equal transformers' generate() token for
token, prompt ids included, the image decides the answer and both lanes prefilled an image;
corrupt image bytes are a 400 and the next request is served. Prefix caching is off for this model (it declares none).

And one ``vllm.LLM`` engine (``generate`` with ``multi_modal_data``) on 4 rows, an 80-token step
budget and a pool of 20 KV blocks: mixed text-only, one- and two-image requests side by side,
prefilled in chunks that never end inside an image, then image requests with long answers
preempted while decoding and resumed (vLLM prefills prompt, images and answer again). Every
answer equals transformers'."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached_gemma4_unified

from tests.e2e import vl_chat
from tests.e2e.helpers import serve
from tests.e2e.vl_chat import (
    BAD_REQUESTS,
    assert_every_lane_prefilled_an_image,
    chat_body,
    image_parts,
    lane_serve,
)
from tests.e2e.vl_offline import assert_gemma_rounds_equal_hf

pytestmark = pytest.mark.e2e

REQUESTS: list[tuple[tuple[int, ...], tuple[int, int]]] = [
    ((), (32, 32)), ((0,), (32, 32)), ((1,), (32, 32)), ((2, 3), (32, 32)), ((3,), (32, 32)), ((0,), (32, 64)),
]
"""Image kinds and size per request; each request its own salt, so its own pixels."""
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoint():
    return cached_gemma4_unified()


def test_serve_chat_with_base64_images_equals_transformers(checkpoint, tmp_path):
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = lane_serve(4, trace)
    with serve(checkpoint, "--max-model-len", "256", *lane_args, "--max-num-batched-tokens", "80",
               "--limit-mm-per-prompt", '{"image": 2, "video": 0}', env=lane_env, log=log) as url:

        def chat(parts: list[dict[str, Any]]) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, MAX_TOKENS), timeout=300)

        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            answers = list(pool.map(chat, [image_parts(kinds, 5 + i, size)
                                           for i, (kinds, size) in enumerate(REQUESTS)]))
        corrupt = chat(BAD_REQUESTS["corrupt image"])
        after = chat(image_parts((2,), 11))
    for response in [*answers, after]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    hf_vl = vl_chat.load_hf(checkpoint)
    want = [vl_chat.hf_generate(hf_vl, kinds, MAX_TOKENS, 5 + i, nested=True, add_special_tokens=False, size=size)
            for i, (kinds, size) in enumerate(REQUESTS)]
    bodies = [response.json() for response in answers]
    assert [b["prompt_token_ids"] for b in bodies] == [w[0] for w in want], "vLLM's expanded prompt ids equal HF's"
    got = [b["choices"][0]["token_ids"] for b in bodies]
    mismatches = [(k, g, w[1]) for k, g, w in zip(REQUESTS, got, want, strict=True) if g != w[1]]
    assert not mismatches, mismatches
    assert len({tuple(g) for g in got[1:3]}) == 2 and got[1] != got[0], "the image decides the answer"
    assert after.json()["choices"][0]["token_ids"] == vl_chat.hf_generate(
        hf_vl, (2,), MAX_TOKENS, 11, nested=True, add_special_tokens=False)[1]
    assert corrupt.status_code == 400, corrupt.text
    assert_every_lane_prefilled_an_image(trace, log, 4, len(want[0][0]))


def test_llm_generate_with_images_equals_transformers_chunked_and_preempted(checkpoint, tmp_path):
    by_kinds = assert_gemma_rounds_equal_hf(checkpoint, vl_chat.load_hf(checkpoint), tmp_path / "steps.jsonl",
                                            [(), (0,), (1,), (2, 3), (3,), (1, 0), (2,)],
                                            [(0,), (2, 1), (3,), (1,)], MAX_TOKENS)
    assert by_kinds[(0,)] != by_kinds[(1,)] and by_kinds[(1,)] != by_kinds[()], "the image decides the answer"
