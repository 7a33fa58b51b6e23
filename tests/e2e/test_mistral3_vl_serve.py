"""Mistral 3 through ``vllm serve`` on the host mesh backend: vLLM's own Mistral 3 processor
(the HF Pixtral processor) expands each image into rows of ``[IMG]`` tokens split by
``[IMG_BREAK]`` and ended by ``[IMG_END]`` and sends its normalised pixels, the runner hands
them to the host model's prefill (Pixtral tower with 2D rotary, patch merger, projector, the
Mistral decoder), and greedy outputs of concurrent OpenAI chat requests with base64
``image_url`` data URLs equal transformers' generate() for text-only, one-image and two-image
requests. One engine start, in lane mode (2 lanes of 4 rows, as the other VL serve tests): a
32-token step budget (a two-image prompt, 48 tokens, is prefilled in several steps; the host
model refuses a chunk that cuts an image), a long two-image prompt sent twice (the second is
served from the prefix cache past both images, which vLLM then sends without pixels), and a
request with too many images (a 400; the next is served)."""

from __future__ import annotations

import concurrent.futures
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached
from vllm_tt_testing.tiny_mistral3 import build_tiny_mistral3
from vllm_tt_testing.tiny_vl import QUESTION

from tests.e2e.helpers import serve
from tests.e2e.vl_chat import (
    assert_every_lane_prefilled_an_image,
    chat_body,
    hf_generate,
    image_parts,
    lane_serve,
)

pytestmark = pytest.mark.e2e

REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (2, 3), (3,), (1, 0), (2,)]
"""Image kinds per request; two of one kind use different seeds (different pixels)."""
MAX_TOKENS = 16
LONG_QUESTION = " ".join([QUESTION] * 8)
"""Two images and this question make a prompt longer than a KV block past its images."""


@pytest.fixture(scope="session")
def mistral3_checkpoint():
    return cached("tiny-mistral3-trained", build_tiny_mistral3)


@pytest.fixture(scope="session")
def hf_mistral3(mistral3_checkpoint):
    import torch
    from transformers import AutoProcessor, Mistral3ForConditionalGeneration

    model = Mistral3ForConditionalGeneration.from_pretrained(mistral3_checkpoint, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(mistral3_checkpoint)


def prefill_steps(trace: Path) -> dict[str, int]:
    """How many prefill steps scheduled tokens of each request, from the lane step trace."""
    steps: dict[str, int] = {}
    for line in trace.read_text().splitlines():
        step = json.loads(line)
        if step["phase"] == "prefill":
            for lane in step["lanes"]:
                for rid in lane["scheduled"]:
                    steps[rid] = steps.get(rid, 0) + 1
    return steps


def test_serve_chat_with_base64_images_equals_transformers(mistral3_checkpoint, hf_mistral3, tmp_path):
    model = str(mistral3_checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = lane_serve(4, trace)
    with serve(mistral3_checkpoint, "--max-model-len", "256", *lane_args, "--max-num-batched-tokens", "32",
               "--limit-mm-per-prompt", '{"image": 2}', "--enable-prompt-tokens-details", env=lane_env,
               log=log) as url:

        def chat(parts: list[dict[str, Any]], question: str = QUESTION) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, MAX_TOKENS, question),
                              timeout=300)

        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            answers = list(pool.map(lambda kinds: chat(image_parts(kinds, 5)), REQUESTS))
        repeated = [chat(image_parts((2, 0), 3), LONG_QUESTION) for _ in range(2)]
        too_many = chat(image_parts((0, 1, 2), 9))
        after = chat(image_parts((3,), 5))
    for response in [*answers, *repeated, after]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    want = [hf_generate(hf_mistral3, kinds, MAX_TOKENS, 5, add_special_tokens=False) for kinds in REQUESTS]
    bodies = [response.json() for response in answers]
    assert [b["prompt_token_ids"] for b in bodies] == [w[0] for w in want], "vLLM's expanded prompt ids equal HF's"
    got = [b["choices"][0]["token_ids"] for b in bodies]
    mismatches = [(k, g, w[1]) for k, g, w in zip(REQUESTS, got, want, strict=True) if g != w[1]]
    assert not mismatches, mismatches

    by_kinds = dict(zip(REQUESTS, got, strict=True))
    singles = [by_kinds[(k,)] for k in range(4)]
    assert len({tuple(a) for a in singles}) == 4, singles  # the image decides the answer
    assert by_kinds[(1,)] != by_kinds[()]
    assert max(prefill_steps(trace).values()) > 1, "the two-image prompts were prefilled in chunks"
    assert_every_lane_prefilled_an_image(trace, log, 4, len(want[REQUESTS.index(())][0]))

    long_want = hf_generate(hf_mistral3, (2, 0), MAX_TOKENS, 3, add_special_tokens=False, question=LONG_QUESTION)
    for response in repeated:
        assert response.json()["prompt_token_ids"] == long_want[0]
        assert response.json()["choices"][0]["token_ids"] == long_want[1]
    image_end = hf_mistral3[1].tokenizer.convert_tokens_to_ids("[IMG_END]")
    last_image_token = max(i for i, t in enumerate(long_want[0]) if t == image_end)
    cached = repeated[1].json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > last_image_token, (cached, last_image_token)

    assert after.json()["choices"][0]["token_ids"] == by_kinds[(3,)]
    assert too_many.status_code == 400 and "At most 2 image(s)" in too_many.json()["error"]["message"]
