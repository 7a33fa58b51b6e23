"""Llama 3.2 Vision (Mllama) through plain vLLM 0.33 on the host mesh backend: vLLM serves it
as an encoder-decoder model (the registry plugin marks its config), the host class brings the
multimodal processor vLLM no longer ships (``<|image|>`` stays in the decoder prompt, each
image's vision keys are placed in the encoder prompt, every image at its start), vLLM allocates
their cross-attention blocks (``CrossAttentionSpec`` group) and the runner passes that group's
table as ``cross_page_table``. Greedy outputs equal transformers' ``generate()`` for text-only,
one-image and two-image requests, concurrently mixed, through
``vllm.LLM.generate(multi_modal_data=...)`` under KV pressure that preempts decoding requests
(their cross-attention blocks freed, re-made and the vision keys written again on resume), and
through ``vllm serve`` in lanes (``MESH_DEVICE=TG``) + OpenAI chat with base64 images; a
corrupt image and too many images are 400s and the next request is served."""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached
from vllm_tt_testing.tiny_mllama import build_tiny_mllama

from tests.e2e.helpers import metric_total, serve
from tests.e2e.vl_chat import (
    assert_every_lane_prefilled_an_image,
    chat_body,
    hf_generate,
    image_parts,
    lane_serve,
    llm_prompts,
    preempted_while_decoding,
    traced_llm,
)

pytestmark = pytest.mark.e2e

REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (2, 3), (3,), (1, 0), (2,)]
MAX_TOKENS = 12
SIZE = (16, 32)
"""Image height, width: two 16-pixel tiles (the second image kind pair differs in answer)."""
LONG_TOKENS = 100
"""The LLM test's answers: 4 rows of up to 111 tokens need 4 self-attention blocks of 32 each,
and up to 3 cross-attention blocks (2 images of 34 vision keys)."""
BLOCKS = 14
"""The LLM engine's KV pool: its self- and cross-attention groups take blocks from it, so the
4 rows do not fit at once and decoding requests are preempted."""


@pytest.fixture(scope="module")
def checkpoint():
    return cached("tiny-mllama-trained", build_tiny_mllama)


@pytest.fixture(scope="module")
def hf_mllama(checkpoint):
    import torch
    from transformers import AutoProcessor, MllamaForConditionalGeneration

    model = MllamaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(checkpoint)


def assert_images_decide(answers: dict[tuple[int, ...], list[int]]) -> None:
    """Text only and one image of each kind give at least three different answers (the tiny
    model answers two kinds alike)."""
    assert len({tuple(answers[k]) for k in [(), (0,), (1,), (2,), (3,)]}) >= 3, answers


def test_llm_generate_with_images_equals_transformers_under_preemption(checkpoint, hf_mllama, tmp_path):
    from vllm import SamplingParams

    trace = tmp_path / "steps.jsonl"
    llm = traced_llm(trace, model=str(checkpoint), max_model_len=160, max_num_batched_tokens=160, max_num_seqs=4,
                     block_size=32, num_gpu_blocks_override=BLOCKS, limit_mm_per_prompt={"image": 2})
    outs = llm.generate(llm_prompts(hf_mllama[1], REQUESTS, 5, SIZE),
                        SamplingParams(max_tokens=LONG_TOKENS, temperature=0.0, ignore_eos=True), use_tqdm=False)
    preemptions = metric_total(llm, "vllm:num_preemptions")
    del llm
    got = {kinds: (list(out.prompt_token_ids), list(out.outputs[0].token_ids))
           for kinds, out in zip(REQUESTS, outs, strict=True)}
    want = {kinds: tuple(hf_generate(hf_mllama, kinds, LONG_TOKENS, 5 + i, nested=True, size=SIZE))
            for i, kinds in enumerate(REQUESTS)}
    mismatches = [(kinds, got[kinds], want[kinds]) for kinds in REQUESTS if got[kinds] != want[kinds]]
    assert not mismatches, mismatches
    assert_images_decide({kinds: answer for kinds, (_, answer) in got.items()})
    decoding = preempted_while_decoding(trace, outs)
    two_images = {out.request_id for kinds, out in zip(REQUESTS, outs, strict=True) if len(kinds) == 2}
    assert preemptions > 0 and two_images & set(decoding), (preemptions, decoding)


def test_serve_chat_with_base64_images_in_lanes_equals_transformers(checkpoint, hf_mllama, tmp_path):
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = lane_serve(4, trace)
    with serve(checkpoint, "--max-model-len", "256", *lane_args, "--limit-mm-per-prompt", '{"image": 2}',
               env=lane_env, log=log) as url:

        def chat(parts):
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, MAX_TOKENS), timeout=300)

        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            replies = list(pool.map(lambda kinds: chat(image_parts(kinds, 2, SIZE)), REQUESTS))
        corrupt = chat([{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                                    + base64.b64encode(b"not a png").decode()}}])
        too_many = chat(image_parts((0, 1, 2), 3, SIZE))
        again = chat(image_parts((1,), 2, SIZE))
    for reply in [*replies, again]:
        assert reply.status_code == 200, (reply.text, log.read_text()[-3000:])
    want = {kinds: hf_generate(hf_mllama, kinds, MAX_TOKENS, 2, nested=True, add_special_tokens=False, size=SIZE)
            for kinds in REQUESTS}
    got = {kinds: reply.json()["choices"][0]["token_ids"] for kinds, reply in zip(REQUESTS, replies, strict=True)}
    mismatches = [(kinds, got[kinds], want[kinds][1]) for kinds in REQUESTS if got[kinds] != want[kinds][1]]
    assert not mismatches, mismatches
    assert_images_decide(got)
    assert again.json()["choices"][0]["token_ids"] == want[(1,)][1]
    assert corrupt.status_code == 400
    assert too_many.status_code == 400 and "At most 2 image" in too_many.text
    assert_every_lane_prefilled_an_image(trace, log, 4, len(want[()][0]))
