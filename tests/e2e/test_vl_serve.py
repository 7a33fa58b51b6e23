"""Qwen2.5-VL through vLLM's engine on the host mesh backend: images reach the model through the
runner's prefill path (vLLM's processor, uint8 pixels, mRoPE deltas on decode), greedy outputs
equal transformers' generate() for text-only, one-image and two-image requests running side
by side, under KV pressure that preempts and resumes them; and through ``vllm serve`` with
OpenAI chat requests carrying base64 ``image_url`` data URLs in lane mode (mRoPE deltas over
every lane's rows), where a long image prompt sent again is served from the prefix cache past
its image, an mp4 ``video_url`` data URL equals HF fed the frames vLLM's video loader decodes
from the same bytes (two videos, two answers), and undecodable video bytes, audio, too many
images and undecodable image bytes are answered with a 400 and the server keeps serving."""

from __future__ import annotations

import concurrent.futures
from typing import Any

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached_qwen_vl

from tests.e2e import vl_chat
from tests.e2e.helpers import offline_llm, serve
from tests.e2e.vl_chat import BAD_REQUESTS, REQUESTS, chat_text, image_parts, images

pytestmark = pytest.mark.e2e

MAX_TOKENS = 24
LONG_QUESTION = " ".join([vl_chat.QUESTION] * 12)
"""With one image this question makes a prompt more than a 64-token block longer than the image's end."""


@pytest.fixture(scope="session")
def qwen_vl_checkpoint():
    return cached_qwen_vl()


@pytest.fixture(scope="session")
def hf_vl(qwen_vl_checkpoint):
    return vl_chat.load_hf(qwen_vl_checkpoint)


def hf_generate(hf_vl, kinds: tuple[int, ...], salt: int = 0, *, chat: bool = False,
                question: str = vl_chat.QUESTION) -> tuple[list[int], list[int]]:
    """HF's (prompt ids, greedy new tokens); ``chat``: tokenized as a chat endpoint does (no bos
    added to the rendered template)."""
    return vl_chat.hf_generate(hf_vl, kinds, MAX_TOKENS, salt, add_special_tokens=not chat, question=question)


def test_llm_generate_with_images_equals_transformers_under_preemption(qwen_vl_checkpoint, hf_vl):
    """Seven mixed requests on 4 decode rows with 8 KV blocks of 32 tokens: vLLM preempts some
    and resumes them (a fresh prefill with their images; the model returns the mRoPE delta again)."""
    from vllm import SamplingParams

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in-process, to read its metrics
        llm = offline_llm(model=str(qwen_vl_checkpoint), max_model_len=192, max_num_seqs=4, block_size=32,
                  num_gpu_blocks_override=8, enable_prefix_caching=False, limit_mm_per_prompt={"image": 2},
                  seed=0, disable_log_stats=False, additional_config={"tt": {"mesh_backend": "host"}})
    processor = hf_vl[1]
    prompts = [{"prompt": chat_text(processor, len(k)), **({"multi_modal_data": {"image": images(k)}} if k else {})}
               for k in REQUESTS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    results = llm.generate(prompts, params, use_tqdm=False)
    preemptions = sum(int(m.value) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    del llm
    expected = [hf_generate(hf_vl, k) for k in REQUESTS]
    got = [(list(r.prompt_token_ids), list(r.outputs[0].token_ids)) for r in results]
    assert [g[0] for g in got] == [e[0] for e in expected], "vLLM's expanded prompt ids equal HF's"
    mismatches = [(k, g[1], e[1]) for k, g, e in zip(REQUESTS, got, expected, strict=True) if g[1] != e[1]]
    assert not mismatches, mismatches
    assert preemptions > 0, "8 blocks for 4 rows of up to 3 blocks each must preempt"
    by_kinds = {k: g[1] for k, g in zip(REQUESTS, got, strict=True)}
    assert by_kinds[(0,)] != by_kinds[(1,)] and by_kinds[(0,)] != by_kinds[()], "the image decides the answer"


def chat_body(model: str, parts: list[dict[str, Any]], question: str = vl_chat.QUESTION) -> dict[str, Any]:
    return vl_chat.chat_body(model, parts, MAX_TOKENS, question)


def test_serve_chat_with_base64_images_equals_transformers_and_refuses_bad_input(qwen_vl_checkpoint, hf_vl, tmp_path):
    """In lanes: image requests are prefilled in both lanes and each decode step sends the
    mRoPE deltas of every lane's rows. Also: a long one-image prompt sent twice (both go to
    lane 0, the least loaded); vLLM hashes the image into the block hashes, so the second hits
    the prefix cache past the image (vLLM 0.33 then sends only its ``image_grid_thw``, which
    the positions after it need) and both equal HF. And two mp4 videos as ``video_url`` parts,
    each equal to HF on the frames vLLM's Qwen2-VL video loader decodes from its bytes."""
    model = str(qwen_vl_checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = vl_chat.lane_serve(4, trace)
    with serve(qwen_vl_checkpoint, "--max-model-len", "512", *lane_args, "--limit-mm-per-prompt", '{"image": 2}',
               "--enable-prompt-tokens-details", env=lane_env, log=log) as url:

        def chat(parts: list[dict[str, Any]], question: str = vl_chat.QUESTION) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, question), timeout=300)

        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            answers = list(pool.map(lambda ks: chat(image_parts(ks[1], 5 + ks[0])), enumerate(REQUESTS)))
        repeated = [chat(image_parts((2,), 13), LONG_QUESTION) for _ in range(2)]
        videos = vl_chat.video_parts(vl_chat.VIDEO_SALTS)
        video_answers = [chat([part]) for part in videos]
        refusals = {}
        for name, parts in BAD_REQUESTS.items():
            refusals[name] = chat(parts or image_parts((0, 1, 2), 9))
            after = chat(image_parts((2,), 11))  # the engine keeps serving
            assert after.status_code == 200, (name, after.text, log.read_text()[-3000:])
    for response in answers:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    for (salt, kinds), response in zip(enumerate(REQUESTS), answers, strict=True):
        body = response.json()
        prompt, tokens = hf_generate(hf_vl, kinds, 5 + salt, chat=True)
        assert body["prompt_token_ids"] == prompt, kinds
        assert body["choices"][0]["token_ids"] == tokens, kinds
    for name, response in refusals.items():
        assert response.status_code == 400, (name, response.status_code, response.text)
        assert response.json()["error"]["message"], name
    # Qwen2.5-VL takes video: the undecodable mp4 is refused by vLLM's video loader
    assert "Could not open video stream" in refusals["video"].json()["error"]["message"]
    assert "At most 2 image(s)" in refusals["three images"].json()["error"]["message"]
    prompt, tokens = hf_generate(hf_vl, (2,), 13, chat=True, question=LONG_QUESTION)
    for response in repeated:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
        assert response.json()["prompt_token_ids"] == prompt
        assert response.json()["choices"][0]["token_ids"] == tokens
    vl_chat.assert_videos_equal_hf(qwen_vl_checkpoint, hf_vl, videos, video_answers, MAX_TOKENS, log)
    image_token = hf_vl[0].config.image_token_id
    last_image_token = max(i for i, t in enumerate(prompt) if t == image_token)
    cached = repeated[1].json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > last_image_token, (cached, last_image_token, len(prompt))
    text_only = len(answers[REQUESTS.index(())].json()["prompt_token_ids"])
    vl_chat.assert_every_lane_prefilled_an_image(trace, log, 4, text_only)
