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
the image or the clip; different clips give different answers.

And one ``vllm serve`` (Gemma 4's checkpoint, in lane mode: ``MESH_DEVICE=TG``, 2 lanes of 2
rows, the same step budget): concurrent OpenAI chats with base64 WAV ``input_audio`` parts
(audio-only, image plus clip, text-only) equal transformers on the waveform vLLM decodes from
the same bytes, prompt ids included, prefilled in passes that never end inside the image or the
clip, and both lanes prefilled a clip; corrupt audio bytes are a 400 and the next clip is
served. Decoding a clip needs vLLM's ``audio`` extra
(``requirements/vllm-*.txt``)."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import numpy as np
import pytest
from vllm_tt_testing.checkpoints import cached_gemma4_audio
from vllm_tt_testing.tiny_gemma4_vl import AUDIO, BOS, IMAGE, TURN_END, TURN_START
from vllm_tt_testing.tiny_vl import QUESTION

from tests.e2e import vl_chat
from tests.e2e.helpers import serve

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


def lead(items: tuple[str, ...]) -> str:
    """The text before the items: a prompt with two items leads with text, so that a chunk may
    end before them."""
    return " ".join([QUESTION] * 3) if len(items) > 1 else ""


def prompt_text(items: tuple[str, ...]) -> str:
    """The chat prompt, as the tiny template renders ``chat_parts`` and the question."""
    parts = "".join(AUDIO if m == "audio" else IMAGE for m in items)
    return f"{BOS}{TURN_START}user\n{lead(items)}{parts}{QUESTION}{TURN_END}\n{TURN_START}model\n"


def hf_generate(hf_vl: tuple[Any, Any], items: tuple[str, ...], salt: int, audio: np.ndarray | None = None,
                ) -> tuple[list[int], list[int]]:
    """HF's (prompt ids, greedy new tokens) for ``prompt_text(items)`` with the salt's image and
    clip (``audio``: another waveform at 16 kHz, e.g. the one vLLM decoded from a WAV)."""
    model, processor = hf_vl
    media: dict[str, Any] = {}
    if "image" in items:
        media["images"] = [vl_chat.images((2,), salt)]
    if "audio" in items:  # a whole clip (the saved feature extractor truncates to a length it does not keep)
        media.update(audio=[clip(salt) if audio is None else audio], audio_kwargs={"truncation": False})
    inputs = processor(text=[prompt_text(items)], return_tensors="pt", add_special_tokens=False, **media)
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


def chat_parts(items: tuple[str, ...], salt: int) -> list[dict[str, Any]]:
    """OpenAI chat parts for ``prompt_text(items)`` (the question follows them): the lead text,
    the salt's image as a PNG data URL, its clip as a base64 16-bit WAV."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": lead(items)}] if lead(items) else []
    for item in items:
        parts += (vl_chat.image_parts((2,), salt) if item == "image"
                  else [vl_chat.audio_part(vl_chat.wav(clip(salt), RATE))])
    return parts


SERVE_ROWS = 2
CORRUPT_AUDIO = vl_chat.audio_part(b"RIFF, but not a WAV file at all")


def test_serve_chat_with_input_audio_equals_transformers(tmp_path):
    """The ``vllm.LLM`` test's requests at once through ``vllm serve`` in lanes, as base64 WAV
    ``input_audio`` parts; then corrupt audio bytes, then another clip."""
    checkpoint = cached_gemma4_audio(unified=False)
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    lane_args, lane_env = vl_chat.lane_serve(SERVE_ROWS, trace)
    salts = range(len(REQUESTS))
    later = 5
    with serve(checkpoint, "--max-model-len", "512", *lane_args, "--max-num-batched-tokens", "768",
               "--long-prefill-token-threshold", "80", "--no-enable-prefix-caching",
               "--limit-mm-per-prompt", '{"image": 1, "audio": 1, "video": 0}', env=lane_env, log=log) as url:
        batch = [chat_parts(items, salt) for items, salt in zip(REQUESTS, salts, strict=True)]
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            answers = list(pool.map(lambda parts: vl_chat.post_chat(url, model, parts, MAX_TOKENS), batch))
        corrupt = vl_chat.post_chat(url, model, [CORRUPT_AUDIO], MAX_TOKENS)
        after_parts = chat_parts(("audio",), later)
        after = vl_chat.post_chat(url, model, after_parts, MAX_TOKENS)
    for response in [*answers, after]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    hf_vl = vl_chat.load_hf(checkpoint)
    keys = [*zip(REQUESTS, salts, strict=True), (("audio",), later)]
    want = []
    for (items, salt), parts in zip(keys, [*batch, after_parts], strict=True):
        waveform = None
        if "audio" in items:
            waveform, rate = vl_chat.served_audio(parts[-1])
            assert rate == RATE, "a WAV at the processor's rate: vLLM does not resample it"
        want.append(hf_generate(hf_vl, items, salt, waveform))
    bodies = [response.json() for response in [*answers, after]]
    assert [b["prompt_token_ids"] for b in bodies] == [w[0] for w in want], "vLLM's expanded prompt ids equal HF's"
    got = [b["choices"][0]["token_ids"] for b in bodies]
    mismatches = [(k, g, w[1]) for k, g, w in zip(keys, got, want, strict=True) if g != w[1]]
    assert not mismatches, mismatches
    assert len({tuple(got[i]) for i in (0, 3, 4)}) == 3, "different clips give different answers"
    config = hf_vl[0].config
    assert [len(vl_chat.image_runs(w[0], config.audio_token_id)) for w in want] == [1, 0, 1, 1, 1]
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    passes = []
    for body in bodies:
        prompt = body["prompt_token_ids"]
        ends = vl_chat.chunk_ends(steps, body["id"], len(prompt))
        runs = [*vl_chat.image_runs(prompt, config.image_token_id), *vl_chat.image_runs(prompt, config.audio_token_id)]
        assert ends and ends[-1] == len(prompt), (body["id"], ends)
        assert not [e for e in ends for first, stop in runs if first < e < stop], (ends, runs)
        passes.append(len(ends))
    assert passes[2] > 1, "the image-plus-clip prompt was prefilled in more than one pass"
    assert corrupt.status_code == 400, (corrupt.status_code, corrupt.text)
    assert corrupt.json()["error"]["message"]
    vl_chat.assert_every_lane_prefilled_an_image(trace, log, SERVE_ROWS, len(want[1][0]))
