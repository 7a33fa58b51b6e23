"""Qwen3-VL through vLLM's engine on the host mesh backend: vLLM's own Qwen3-VL processor
(uint8 pixels, the checkpoint's 0.5 mean / std), the tower with DeepStack inside the prefill,
interleaved mRoPE with the returned deltas on decode. Greedy outputs equal transformers'
generate() token for token for text-only, one-image and two-image requests running side by
side, through ``vllm.LLM`` (chunked prefill never cutting an image, preemption under KV
pressure) and through ``vllm serve`` (OpenAI chat, base64 ``image_url`` data URLs, two lanes, a
prefix-cache hit past an image, an mp4 ``video_url`` data URL: HF is fed the frames vLLM's
video loader decodes from the same bytes); different images, and different videos, give HF's
different answers; audio, too many images or videos and undecodable image or video bytes are
answered with a 400 and the next request is served (videos through ``vllm.LLM``:
``test_qwen_vl_video.py``)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached_qwen3_vl

from tests.e2e import vl_chat
from tests.e2e.helpers import serve
from tests.e2e.vl_chat import REQUESTS, VIDEO_BAD_REQUESTS, VIDEO_LIMITS, image_parts
from tests.e2e.vl_offline import assert_chunked_preempted_equal_hf

pytestmark = pytest.mark.e2e

MAX_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoint():
    return cached_qwen3_vl()


@pytest.fixture(scope="module")
def hf_vl(checkpoint):
    return vl_chat.load_hf(checkpoint)


def hf_generate(hf_vl, kinds: tuple[int, ...], salt: int = 0, *, chat: bool = False,
                question: str = vl_chat.QUESTION) -> tuple[list[int], list[int]]:
    return vl_chat.hf_generate(hf_vl, kinds, MAX_TOKENS, salt, add_special_tokens=not chat, question=question)


CHUNKED_QUESTION = " ".join([vl_chat.QUESTION] * 6)
"""With two images this question makes a prompt longer than the 64-token step budget."""


def test_llm_generate_with_images_equals_transformers_chunked_and_preempted(checkpoint, hf_vl, tmp_path):
    """Seven mixed requests on 4 decode rows, submitted at once, with a 64-token step budget
    (the most one image may take): the two-image prompts are longer and are prefilled in chunks
    that end outside their images, a later chunk computing the second image's tower and
    DeepStack sets alone; 8 KV blocks of 32 tokens make vLLM preempt some and resume them (a
    fresh prefill with their images, the mRoPE delta returned again)."""
    by_kinds = assert_chunked_preempted_equal_hf(checkpoint, hf_vl, tmp_path / "steps.jsonl", REQUESTS,
                                                 CHUNKED_QUESTION, MAX_TOKENS)
    assert len({tuple(by_kinds[k]) for k in ((), (0,), (1,), (2, 3))}) == 4, "the images decide the answer"


LONG_QUESTION = " ".join([vl_chat.QUESTION] * 12)
"""With one image this question makes a prompt more than a 64-token block longer than the image's end."""


def test_serve_chat_with_base64_images_equals_transformers_and_refuses_bad_input(checkpoint, hf_vl, tmp_path):
    """In two lanes of 4 rows; also a long one-image prompt sent twice: the second is served
    from the prefix cache past its image (no tower, no DeepStack for it) and both equal HF; and
    two mp4 videos as ``video_url`` parts (vLLM's Qwen3-VL loader decodes them, its processor
    adds the timestamp text), each equal to HF on the frames vLLM decodes."""
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = vl_chat.lane_serve(4, trace)
    with serve(checkpoint, "--max-model-len", "256", *lane_args, "--limit-mm-per-prompt", VIDEO_LIMITS,
               "--enable-prompt-tokens-details", env=lane_env, log=log) as url:

        def chat(parts: list[dict[str, Any]], question: str = vl_chat.QUESTION) -> httpx.Response:
            body = vl_chat.chat_body(model, parts, MAX_TOKENS, question)
            return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)

        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            answers = list(pool.map(lambda ks: chat(image_parts(ks[1], 5 + ks[0])), enumerate(REQUESTS)))
        repeated = [chat(image_parts((2,), 13), LONG_QUESTION) for _ in range(2)]
        videos = vl_chat.video_parts(vl_chat.VIDEO_SALTS)
        video_answers = [chat([part]) for part in videos]
        refusals, after = {}, {}
        for name, parts in VIDEO_BAD_REQUESTS.items():
            refusals[name] = chat(parts or image_parts((0, 1, 2), 9))
            after[name] = chat(image_parts((2,), 11))  # the engine keeps serving
    for response in [*answers, *after.values()]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    for (salt, kinds), response in zip(enumerate(REQUESTS), answers, strict=True):
        body = response.json()
        prompt, tokens = hf_generate(hf_vl, kinds, 5 + salt, chat=True)
        assert body["prompt_token_ids"] == prompt, kinds
        assert body["choices"][0]["token_ids"] == tokens, kinds
    expected_after = hf_generate(hf_vl, (2,), 11, chat=True)[1]
    assert all(r.json()["choices"][0]["token_ids"] == expected_after for r in after.values())
    for name, response in refusals.items():
        assert response.status_code == 400, (name, response.status_code, response.text)
        assert response.json()["error"]["message"], name
    assert "At most 1 video(s)" in refusals["two videos"].json()["error"]["message"]
    assert "At most 2 image(s)" in refusals["three images"].json()["error"]["message"]
    prompt, tokens = vl_chat.hf_generate(hf_vl, (2,), MAX_TOKENS, 13, add_special_tokens=False,
                                         question=LONG_QUESTION)
    for response in repeated:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
        assert response.json()["prompt_token_ids"] == prompt
        assert response.json()["choices"][0]["token_ids"] == tokens
    vl_chat.assert_videos_equal_hf(checkpoint, hf_vl, videos, video_answers, MAX_TOKENS, log)
    last_image_token = max(i for i, t in enumerate(prompt) if t == hf_vl[0].config.image_token_id)
    cached_tokens = repeated[1].json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached_tokens > last_image_token, (cached_tokens, last_image_token, len(prompt))
    text_only = len(answers[REQUESTS.index(())].json()["prompt_token_ids"])
    vl_chat.assert_every_lane_prefilled_an_image(trace, log, 4, text_only)
