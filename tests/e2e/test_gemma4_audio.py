"""Gemma 4 audio (``TTGemma4ForConditionalGeneration`` on a checkpoint with an ``audio_config``, as
the E-series have, and Gemma 4 Unified) through ``vllm.LLM`` on the host mesh backend. vLLM's
Gemma 4 processor turns each clip into log-mel frames (``input_features_padded``,
``input_features_mask``) and one audio token per four frames between the audio markers; the host
model runs its audio tower (a conformer) and embedder and places the vectors at those tokens,
causal like text. Unified's processor cuts the waveform into frames of raw samples, one token
each, which its encoder-free embedder projects.

Clips go in as waveforms (``multi_modal_data={"audio": [(samples, rate)]}``). Greedy outputs equal
transformers' ``generate()`` token for token, prompt ids included, for text-only, one-clip and
image-plus-clip prompts side by side, the longer ones prefilled in chunks that never end inside
the image or the clip; different clips give different answers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from vllm_tt_testing.checkpoints import cached_gemma4_audio
from vllm_tt_testing.tiny_gemma4_vl import AUDIO, BOS, IMAGE, TURN_END, TURN_START
from vllm_tt_testing.tiny_vl import QUESTION

from tests.e2e import vl_chat

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12
RATE = 16000
REQUESTS: list[tuple[str, ...]] = [("audio",), (), ("image", "audio"), ("audio",)]
"""The items of each prompt, in prompt order; the two one-clip prompts have different clips."""


UNIFIED = "Gemma4UnifiedForConditionalGeneration"


@pytest.fixture(scope="module", params=["Gemma4ForConditionalGeneration", UNIFIED])
def checkpoint(request):
    """Gemma 4 with its audio tower, Gemma 4 Unified with its encoder-free audio embedder."""
    return cached_gemma4_audio(unified=request.param == UNIFIED)


@pytest.fixture(scope="module")
def hf_vl(checkpoint):
    return vl_chat.load_hf(checkpoint)


def clip(salt: int, seconds: float = 0.5) -> np.ndarray:
    """A float32 waveform at 16 kHz: two tones of the salt's pitches."""
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * (180 + 131 * salt) * t) + 0.2 * np.sin(2 * np.pi * (900 + 77 * salt) * t)
            ).astype(np.float32)


def prompt_text(items: tuple[str, ...]) -> str:
    """The chat prompt (the tiny template writes image parts only); one with two items leads with
    text, so that a chunk may end before them."""
    parts = "".join(AUDIO if m == "audio" else IMAGE for m in items)
    lead = " ".join([QUESTION] * 3) if len(items) > 1 else ""
    return f"{BOS}{TURN_START}user\n{lead}{parts}{QUESTION}{TURN_END}\n{TURN_START}model\n"


def hf_generate(hf_vl: tuple[Any, Any], items: tuple[str, ...], salt: int, text: str | None = None,
                ) -> tuple[list[int], list[int]]:

    model, processor = hf_vl
    media: dict[str, Any] = {}
    if "image" in items:
        media["images"] = [vl_chat.images((2,), salt)]
    if "audio" in items:  # a whole clip (the saved feature extractor truncates to a length it does not keep)
        media.update(audio=[clip(salt)], audio_kwargs={"truncation": False})
    inputs = processor(text=[prompt_text(items) if text is None else text], return_tensors="pt",
                       add_special_tokens=False, **media)
    return vl_chat.greedy_of(model, inputs, MAX_TOKENS)


def vllm_prompt(items: tuple[str, ...], salt: int) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if "image" in items:
        data["image"] = vl_chat.images((2,), salt)
    if "audio" in items:
        data["audio"] = [(clip(salt), RATE)]
    return vl_chat.item_prompt(prompt_text(items), data)


def test_llm_generate_with_audio_equals_transformers_chunked(checkpoint, hf_vl, tmp_path):
    """Four requests at once on 4 rows, prefill passes of at most 80 tokens (the step budget holds
    vLLM's largest clip, 750 tokens, as an unsplit item needs)."""
    from vllm import SamplingParams

    trace = tmp_path / "steps.jsonl"
    llm = vl_chat.traced_llm(trace, model=str(checkpoint), max_model_len=512, max_num_seqs=4, block_size=32,
                             max_num_batched_tokens=768, long_prefill_token_threshold=80,
                             enable_chunked_prefill=True, enable_prefix_caching=False,
                             limit_mm_per_prompt={"image": 1, "audio": 1, "video": 0})
    salts = range(len(REQUESTS))
    results = llm.generate([vllm_prompt(items, salt) for items, salt in zip(REQUESTS, salts, strict=True)],
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    del llm
    expected = [hf_generate(hf_vl, items, salt) for items, salt in zip(REQUESTS, salts, strict=True)]
    got = vl_chat.assert_outputs_equal_hf(REQUESTS, results, expected)
    assert got[0][1] != got[3][1], "different clips give different answers"
    config = hf_vl[0].config
    assert len(vl_chat.image_runs(got[0][0], config.audio_token_id)) == 1
    vl_chat.assert_chunks_keep_images(trace, results, config.image_token_id)
    assert vl_chat.assert_chunks_keep_images(trace, results, config.audio_token_id) >= 1, "a prompt took two chunks"
