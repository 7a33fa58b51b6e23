"""Llama 3.2 Vision (Mllama) through plain vLLM 0.33 on the host mesh backend: vLLM serves it
as an encoder-decoder model (the registry plugin marks its config), the host class brings the
multimodal processor vLLM no longer ships (``<|image|>`` stays in the decoder prompt, each
image's vision keys are placed in the encoder prompt), vLLM allocates their cross-attention
blocks (``CrossAttentionSpec`` group) and the runner passes that group's table as
``cross_page_table``. Greedy outputs equal transformers' ``generate()`` for text-only and
one-image requests, concurrently mixed, through ``vllm.LLM.generate(multi_modal_data=...)``
and through ``vllm serve`` + OpenAI chat with base64 images; a corrupt image and too many
images are 400s and the next request is served."""

from __future__ import annotations

import base64

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached
from vllm_tt_testing.tiny_mllama import build_tiny_mllama

from tests.e2e.helpers import offline_llm, serve
from tests.e2e.vl_chat import chat_body, chat_text, hf_generate, image_parts, images

pytestmark = pytest.mark.e2e

REQUESTS: list[tuple[int, ...]] = [(), (0,), (1,), (3,)]
MAX_TOKENS = 12
SIZE = (16, 32)
"""Image height, width: two 16-pixel tiles (the second image kind pair differs in answer)."""


@pytest.fixture(scope="module")
def checkpoint():
    return cached("tiny-mllama-trained", build_tiny_mllama)


@pytest.fixture(scope="module")
def hf_mllama(checkpoint):
    import torch
    from transformers import AutoProcessor, MllamaForConditionalGeneration

    model = MllamaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()
    return model, AutoProcessor.from_pretrained(checkpoint)


def test_llm_generate_with_images_equals_transformers(checkpoint, hf_mllama):
    from vllm import SamplingParams

    llm = offline_llm(model=str(checkpoint), max_model_len=256, max_num_seqs=4, limit_mm_per_prompt={"image": 1})
    processor = hf_mllama[1]
    prompts = [{"prompt": chat_text(processor, len(kinds))}
               | ({"multi_modal_data": {"image": images(kinds, 1, SIZE)[0]}} if kinds else {}) for kinds in REQUESTS]
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    answers = set()
    for kinds, out in zip(REQUESTS, outs, strict=True):
        prompt, expected = hf_generate(hf_mllama, kinds, MAX_TOKENS, 1, nested=True, size=SIZE)
        assert (list(out.prompt_token_ids), list(out.outputs[0].token_ids)) == (prompt, expected), kinds
        answers.add(tuple(expected))
    assert len(answers) >= 3  # text-only and images of different kinds answer differently


def test_serve_chat_with_base64_images_equals_transformers(checkpoint, hf_mllama):
    model = str(checkpoint)
    with serve(checkpoint, "--max-model-len", "256", "--max-num-seqs", "4",
               "--limit-mm-per-prompt", '{"image": 1}') as url:

        def chat(parts):
            return httpx.post(f"{url}/v1/chat/completions", json=chat_body(model, parts, MAX_TOKENS), timeout=300)

        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(len(REQUESTS)) as pool:
            replies = list(pool.map(lambda kinds: chat(image_parts(kinds, 2, SIZE)), REQUESTS))
        for kinds, reply in zip(REQUESTS, replies, strict=True):
            assert reply.status_code == 200, reply.text
            _, expected = hf_generate(hf_mllama, kinds, MAX_TOKENS, 2, nested=True, add_special_tokens=False,
                                      size=SIZE)
            assert reply.json()["choices"][0]["token_ids"] == expected, kinds
        corrupt = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"
                                                              + base64.b64encode(b"not a png").decode()}}]
        assert chat(corrupt).status_code == 400
        too_many = chat(image_parts((0, 1), 3, SIZE))
        assert too_many.status_code == 400 and "At most 1 image" in too_many.text
        again = chat(image_parts((1,), 2, SIZE))
        assert again.status_code == 200 and again.json()["choices"][0]["token_ids"] == \
            hf_generate(hf_mllama, (1,), MAX_TOKENS, 2, nested=True, add_special_tokens=False, size=SIZE)[1]
