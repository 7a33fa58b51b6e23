"""Gemma 3 vision-language through vLLM's engine on the host mesh backend: vLLM's own Gemma 3
processor turns the images into normalised ``pixel_values``, the runner hands them to the host
model's prefill (SigLIP tower, projector, bidirectional attention over each image, sliding
window shorter than an image), and greedy outputs equal transformers' generate() for text-only,
one-image and two-image requests side by side, through ``vllm.LLM`` with ``multi_modal_data``
(prompts chunked at 48 tokens, never inside an image; pan-and-scan crops) and through
``vllm serve`` in lane mode with OpenAI chat requests carrying base64 ``image_url`` data URLs.
The tiny checkpoint is trained so that the image decides the answer: different images give
HF's different answers."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached
from vllm_tt_testing.tiny_gemma3_vl import MM_TOKENS, build_tiny_gemma3_vl
from vllm_tt_testing.tiny_vl import QUESTION

from tests.e2e.helpers import offline_llm, serve
from tests.e2e.vl_chat import (
    assert_chunks_keep_images,
    assert_every_lane_prefilled_an_image,
    chat_body,
    chat_text,
    hf_generate,
    image_parts,
    image_runs,
    images,
    lane_serve,
)

pytestmark = pytest.mark.e2e

REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (2, 3), (3,), (1, 0), (2,)]
"""Image kinds per request; two of one kind use different seeds (different pixels)."""
MAX_TOKENS = 16
CHUNK = 48
"""vLLM's token budget per step in the LLM test: a two-image prompt (53 tokens) needs two chunks;
vLLM wants an image with its crops (3 x 16 tokens) to fit one."""
PAN_AND_SCAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16, "pan_and_scan_max_num_crops": 2,
                "pan_and_scan_min_ratio_to_activate": 1.2}
"""Gemma 3's pan-and-scan, sized for the tiny images, on for the whole LLM engine (vLLM sizes its
encoder cache for the crops at startup) and the server: a 32x64 image gets the original plus 2
crops, the square 32x32 images get none."""
WIDE = (32, 64)


@pytest.fixture(scope="session")
def gemma3_vl_checkpoint():
    return cached("tiny-gemma3-vl-trained", build_tiny_gemma3_vl)


@pytest.fixture(scope="session")
def hf_gemma3_vl(gemma3_vl_checkpoint):
    import torch
    from transformers import AutoProcessor, Gemma3ForConditionalGeneration

    model = Gemma3ForConditionalGeneration.from_pretrained(gemma3_vl_checkpoint, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(gemma3_vl_checkpoint)


def expected(hf_gemma3_vl, salt: int = 0) -> list[tuple[list[int], list[int]]]:
    return [hf_generate(hf_gemma3_vl, kinds, MAX_TOKENS, salt, nested=True) for kinds in REQUESTS]


def assert_image_decides(answers: list[list[int]]) -> None:
    """The one-image answers differ by kind, and from the text-only answer."""
    by_kinds = dict(zip(REQUESTS, answers, strict=True))
    singles = [by_kinds[(k,)] for k in range(4)]
    assert len({tuple(a) for a in singles}) == 4, singles
    assert by_kinds[(1,)] != by_kinds[()], "an image changes the answer"


@pytest.fixture(scope="module")
def gemma3_vl_llm(gemma3_vl_checkpoint, tmp_path_factory):
    """One ``vllm.LLM`` engine (4 rows, 48-token step budget, pan-and-scan on) and its scheduler step trace."""

    trace = tmp_path_factory.mktemp("gemma3-vl-steps") / "steps.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_STEP_TRACE", str(trace))
        llm = offline_llm(model=str(gemma3_vl_checkpoint), max_model_len=256, max_num_seqs=4, block_size=32,
                  max_num_batched_tokens=CHUNK, enable_chunked_prefill=True, limit_mm_per_prompt={"image": 2},
                  mm_processor_kwargs=PAN_AND_SCAN, seed=0, additional_config={"tt": {"mesh_backend": "host"}})
    yield llm, trace
    del llm


def test_llm_generate_with_images_equals_transformers_chunked(gemma3_vl_llm, hf_gemma3_vl):
    """Seven mixed requests on 4 decode rows with a 48-token step budget: every prompt with
    two images is prefilled in chunks, each chunk ending outside the images."""
    from vllm import SamplingParams

    llm, trace_path = gemma3_vl_llm
    processor = hf_gemma3_vl[1]
    prompts = [{"prompt": chat_text(processor, len(k)), **({"multi_modal_data": {"image": images(k)}} if k else {})}
               for k in REQUESTS]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    results = llm.generate(prompts, params, use_tqdm=False)
    want = expected(hf_gemma3_vl)
    got = [(list(r.prompt_token_ids), list(r.outputs[0].token_ids)) for r in results]
    assert [g[0] for g in got] == [e[0] for e in want], "vLLM's expanded prompt ids equal HF's"
    mismatches = [(k, g[1], e[1]) for k, g, e in zip(REQUESTS, got, want, strict=True) if g[1] != e[1]]
    assert not mismatches, mismatches
    assert_image_decides([g[1] for g in got])

    image_token = hf_gemma3_vl[0].config.image_token_id
    for kinds, result in zip(REQUESTS, results, strict=True):
        runs = image_runs(list(result.prompt_token_ids), image_token)
        assert [stop - first for first, stop in runs] == [MM_TOKENS] * len(kinds)
    chunked = assert_chunks_keep_images(trace_path, results, image_token)
    assert chunked >= 2, "the two-image prompts were prefilled in more than one chunk"


LONG_QUESTION = " ".join([QUESTION] * 8)
"""Two images and this question make a prompt longer than vLLM's KV block group (64 tokens)."""


def test_prefix_cache_reuses_only_the_same_images(gemma3_vl_llm, hf_gemma3_vl):
    """A long two-image prompt sent again hits vLLM's prefix cache (it hashes the image
    content) past both images (vLLM 0.33 then sends no pixels for them) and still equals HF;
    the same text with other images reuses no block holding an image and equals HF. (With
    this long question the tiny model's answer no longer depends on the image.)"""
    from vllm import SamplingParams

    llm = gemma3_vl_llm[0]
    processor = hf_gemma3_vl[1]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    runs = [((2, 0), 3), ((2, 0), 3), ((1, 3), 4)]
    results = [llm.generate([{"prompt": chat_text(processor, 2, LONG_QUESTION),
                              "multi_modal_data": {"image": images(kinds, salt)}}], params, use_tqdm=False)[0]
               for kinds, salt in runs]
    want = [hf_generate(hf_gemma3_vl, kinds, MAX_TOKENS, salt, nested=True, question=LONG_QUESTION)
            for kinds, salt in runs]
    assert [list(r.prompt_token_ids) for r in results] == [w[0] for w in want]
    assert [list(r.outputs[0].token_ids) for r in results] == [w[1] for w in want]
    image_token = hf_gemma3_vl[0].config.image_token_id
    last_image_token = max(i for i, t in enumerate(want[0][0]) if t == image_token)
    cached = [r.num_cached_tokens for r in results]
    assert cached[1] > last_image_token, (cached, last_image_token)
    first_image_token = want[2][0].index(image_token)
    assert cached[2] <= first_image_token, (cached, first_image_token)


def test_an_image_longer_than_a_prefill_chunk_is_refused(gemma3_vl_llm, hf_gemma3_vl):
    """With pan-and-scan, a wide image spans its crops and the text between them (~70 tokens),
    more than this engine's 48-token chunk; images are never split over chunks, so vLLM would
    keep the request waiting forever. It is refused before the engine sees it, naming the flag,
    and the next image request is served."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    llm = gemma3_vl_llm[0]
    processor = hf_gemma3_vl[1]
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    wide = {"prompt": chat_text(processor, 1), "multi_modal_data": {"image": images((0,), 7, WIDE)}}
    with pytest.raises(VLLMValidationError, match=r"image 0 of the request spans \d+ prompt tokens.*\(48: images "
                                                  r"are never split.*--max-num-batched-tokens"):
        llm.generate([wide], params, use_tqdm=False)
    square = {"prompt": chat_text(processor, 1), "multi_modal_data": {"image": images((3,), 7)}}
    result = llm.generate([square], params, use_tqdm=False)[0]
    assert list(result.outputs[0].token_ids) == hf_generate(hf_gemma3_vl, (3,), MAX_TOKENS, 7, nested=True)[1]


WIDE_REQUESTS: list[tuple[int, ...]] = [(0,), (3,), (1, 2)]
"""Image kinds of the wide (pan-and-scan) requests served beside ``REQUESTS``."""


def test_serve_chat_with_base64_images_equals_transformers(gemma3_vl_checkpoint, hf_gemma3_vl, tmp_path):
    """In lane mode (2 lanes of 4 rows), pan-and-scan on: seven concurrent OpenAI chat requests
    (text only, one and two square images) and three with wide images, each of which the
    processor gives two crops (three image placeholder runs, the processor's text between them),
    equal HF with the same processor arguments, prompt ids included, and images are prefilled in
    both lanes. A long wide-image request sent twice is served from the prefix cache past its
    crops (vLLM then sends no pixels for it). A third image is refused with a 400 and the next
    request is served."""
    model = str(gemma3_vl_checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = lane_serve(4, trace)
    with serve(gemma3_vl_checkpoint, "--max-model-len", "256", *lane_args, "--limit-mm-per-prompt", '{"image": 2}',
               "--mm-processor-kwargs", json.dumps(PAN_AND_SCAN), "--enable-prompt-tokens-details",
               env=lane_env, log=log) as url:

        def chat(parts: list[dict[str, Any]], question: str = QUESTION) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, MAX_TOKENS, question),
                              timeout=300)

        batch = [image_parts(kinds, 5) for kinds in REQUESTS] + [image_parts(k, 5, WIDE) for k in WIDE_REQUESTS]
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            answers = list(pool.map(chat, batch))
        repeated = [chat(image_parts((2,), 13, WIDE), LONG_QUESTION) for _ in range(2)]
        too_many = chat(image_parts((0, 1, 2), 9))
        after = chat(image_parts((3,), 5))
    for response in [*answers, *repeated, after]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    want = [hf_generate(hf_gemma3_vl, kinds, MAX_TOKENS, 5, nested=True, add_special_tokens=False)
            for kinds in REQUESTS]
    want += [hf_generate(hf_gemma3_vl, kinds, MAX_TOKENS, 5, nested=True, add_special_tokens=False, size=WIDE,
                         processor_kwargs=PAN_AND_SCAN) for kinds in WIDE_REQUESTS]
    bodies = [response.json() for response in answers]
    assert [b["prompt_token_ids"] for b in bodies] == [w[0] for w in want]
    got = [b["choices"][0]["token_ids"] for b in bodies]
    kinds_sent = [*REQUESTS, *(("wide", *k) for k in WIDE_REQUESTS)]
    mismatches = [(k, g, w[1]) for k, g, w in zip(kinds_sent, got, want, strict=True) if g != w[1]]
    assert not mismatches, mismatches
    assert_image_decides(got[:len(REQUESTS)])
    image_token = hf_gemma3_vl[0].config.image_token_id
    runs = [len(image_runs(b["prompt_token_ids"], image_token)) for b in bodies[len(REQUESTS):]]
    assert runs == [3 * len(k) for k in WIDE_REQUESTS], runs
    prompt, tokens = hf_generate(hf_gemma3_vl, (2,), MAX_TOKENS, 13, nested=True, add_special_tokens=False,
                                 question=LONG_QUESTION, size=WIDE, processor_kwargs=PAN_AND_SCAN)
    assert [r.json()["choices"][0]["token_ids"] for r in repeated] == [tokens, tokens]
    last_image_token = max(i for i, t in enumerate(prompt) if t == image_token)
    cached = repeated[1].json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached > last_image_token, (cached, last_image_token, len(prompt))
    assert after.json()["choices"][0]["token_ids"] == got[REQUESTS.index((3,))]
    assert too_many.status_code == 400 and "At most 2 image(s)" in too_many.json()["error"]["message"]
    assert_every_lane_prefilled_an_image(trace, log, 4, len(bodies[REQUESTS.index(())]["prompt_token_ids"]))
