"""Gemma 4 video (``TTGemma4ForConditionalGeneration`` and Gemma 4 Unified,
``TTGemma4UnifiedForConditionalGeneration``) through ``vllm.LLM`` on the host mesh backend. Gemma 4 has no video tower: vLLM's Gemma 4 processor cuts a video into its frames, runs
each through the image processor at 70 soft tokens and writes it as ``mm:ss`` timestamp text and
its own run of video tokens between begin and end markers (``pixel_values_videos``,
``pixel_position_ids_videos``); the host model embeds each frame with the vision tower (Unified:
its encoder-free embedder), and a frame's tokens attend to each other as an image's do.

Videos go in as frames (``multi_modal_data={"video": [(frames, metadata)]}``), as vLLM's offline
API takes them, so vLLM and transformers see the same pixels. transformers 5.20's
``Gemma4Model.forward`` calls ``get_video_features`` without the frame counts it requires (a
``ValueError`` for any video), so the oracle is transformers' own pieces: its processor (prompt
ids, frame patches), its ``get_video_features`` / ``get_image_features`` given the counts, and
its forward over the resulting ``mm_encoder_outputs`` with the processor's ``mm_token_type_ids``
(the bidirectional frame blocks), greedy token by token. Greedy outputs equal that oracle for
text-only, one-video and image-plus-video prompts side by side, chunked without ending inside an
image or video; on Gemma 4 (Unified declares no prefix caching) the same video prompt sent again
is served from the prefix cache past its video (vLLM then sends no frames for it), and so is one
that continues it with an image: the runner sends every item's placeholder range, by which the
model counts the covered video's frame runs before the image it computes.

Through ``vllm serve`` (Gemma 4) a video comes as an OpenAI ``video_url`` part (here a base64 mp4 data
URL): the tiny chat template writes its ``<|video|>``, and the front end decodes the file with
vLLM's default ``opencv`` loader (Gemma 4's video processor has no loader of its own), which
keeps every frame up to ``num_frames`` of ``--media-io-kwargs`` (32 unless set) and otherwise
takes that many evenly spaced ones, with the file's own clock. The oracle is fed the frames and
metadata that loader decodes from the same bytes (OpenCV's ``mp4v`` is lossy)."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import pytest
from vllm_tt_testing.checkpoints import cached_gemma4_unified, cached_gemma4_vl
from vllm_tt_testing.tiny_gemma4_vl import BOS, IMAGE, TURN_END, TURN_START, VIDEO
from vllm_tt_testing.tiny_vl import QUESTION

from tests.e2e import vl_chat
from tests.e2e.helpers import metric_total, serve

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12
FRAMES, FPS = 2, 1.0
"""Two frames a second apart: timestamps ``00:00`` and ``00:01``."""
REQUESTS: list[tuple[str, ...]] = [("video",), (), ("image", "video"), ("video",)]
"""The items of each prompt, in prompt order; the two one-video prompts have different frames."""
LONG_QUESTION = " ".join([QUESTION] * 12)
"""After one video this question makes a prompt whose full KV blocks reach past the video."""


CHECKPOINTS: dict[str, Any] = {
    "Gemma4ForConditionalGeneration": cached_gemma4_vl,
    "Gemma4UnifiedForConditionalGeneration": cached_gemma4_unified,
}
"""Each model's tiny trained checkpoint (the ones its image tests use)."""
PREFIX_CACHING = {"Gemma4ForConditionalGeneration"}
"""The models that declare prefix caching (Unified does not: an image token sees its whole image)."""


@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(arch):
    return CHECKPOINTS[arch]()


@pytest.fixture(scope="module")
def hf_vl(checkpoint):
    return vl_chat.load_hf(checkpoint)


def metadata() -> dict[str, Any]:
    return {"fps": FPS, "duration": FRAMES / FPS, "total_num_frames": FRAMES, "frames_indices": list(range(FRAMES)),
            "video_backend": "opencv"}


def prompt_text(items: tuple[str, ...], question: str = QUESTION) -> str:
    """The chat prompt, as the tiny template renders a user turn of these parts and the question;
    one with two items leads with text, so that a chunk may end before them."""
    parts = "".join(VIDEO if m == "video" else IMAGE for m in items)
    lead = " ".join([QUESTION] * 3) if len(items) > 1 else ""
    return f"{BOS}{TURN_START}user\n{lead}{parts}{question}{TURN_END}\n{TURN_START}model\n"


VIDEO_THEN_IMAGE = prompt_text(("video",), f"{LONG_QUESTION}{IMAGE}{QUESTION}")
"""The long video prompt's text up to its question, then an image: a prefix-cache hit covers
the video (vLLM sends no frames for it) and the pass computes the image."""


def hf_greedy(hf_vl: tuple[Any, Any], items: tuple[str, ...], salt: int, question: str = QUESTION, *,
              video: tuple[Any, dict[str, Any]] | None = None, text: str | None = None,
              ) -> tuple[list[int], list[int]]:
    """transformers' (prompt ids, greedy tokens): its processor, its encoders, its forward.
    ``video``: the frames and vLLM's metadata of them (``vl_chat.served_video``) in place of
    ``salt``'s frames; ``text``: the prompt, in place of ``prompt_text``'s."""
    import torch
    from transformers.video_utils import VideoMetadata

    model, processor = hf_vl
    media: dict[str, Any] = {}
    if "image" in items:
        media["images"] = [vl_chat.images((2,), salt)]
    if "video" in items:
        pixels, clock = video or (vl_chat.video_frames(salt, FRAMES), metadata())
        clock = {k: v for k, v in clock.items() if k != "do_sample_frames"}
        media.update(videos=[pixels], video_metadata=[VideoMetadata(**clock)], do_sample_frames=False)
    inputs = processor(text=[text or prompt_text(items, question)], return_tensors="pt", add_special_tokens=False,
                       **media)
    encoders = model.model
    with torch.no_grad():
        encoded: dict[str, Any] = {}
        if "pixel_values" in inputs:
            encoded["image"] = encoders.get_image_features(inputs["pixel_values"], inputs["image_position_ids"],
                                                           return_dict=True)
        if "pixel_values_videos" in inputs:
            encoded["video"] = encoders.get_video_features(
                inputs["pixel_values_videos"], inputs["video_position_ids"],
                num_frames_per_video=inputs["num_frames_per_video"], return_dict=True)
        ids, types = inputs["input_ids"], inputs["mm_token_type_ids"]
        prompt = ids[0].tolist()
        for _ in range(MAX_TOKENS):
            logits = model(input_ids=ids, mm_token_type_ids=types, mm_encoder_outputs=dict(encoded)).logits[0, -1]
            ids = torch.cat((ids, logits.argmax()[None, None]), dim=1)
            types = torch.cat((types, types.new_zeros((1, 1))), dim=1)
    return prompt, ids[0, len(prompt):].tolist()


def vllm_prompt(items: tuple[str, ...], salt: int, question: str = QUESTION, text: str | None = None,
                ) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if "image" in items:
        data["image"] = vl_chat.images((2,), salt)
    if "video" in items:
        data["video"] = [(vl_chat.video_frames(salt, FRAMES), metadata())]
    return vl_chat.item_prompt(text or prompt_text(items, question), data)


def test_llm_generate_with_videos_equals_transformers_chunked_and_prefix_cached(arch, checkpoint, hf_vl, tmp_path):
    """Four requests at once on 4 rows, prefill chunks of at most 160 tokens (a video of two
    frames is 145), then a long video prompt twice: with prefix caching (Gemma 4) the second is
    a hit past the video."""
    from vllm import SamplingParams

    trace = tmp_path / "steps.jsonl"
    caching = arch in PREFIX_CACHING
    llm = vl_chat.traced_llm(trace, model=str(checkpoint), max_model_len=512, max_num_seqs=4, block_size=32,
                             max_num_batched_tokens=256, long_prefill_token_threshold=160,
                             enable_chunked_prefill=True, enable_prefix_caching=caching,
                             limit_mm_per_prompt={"image": 1, "video": {"count": 1, "num_frames": FRAMES,
                                                                        "width": 32, "height": 32}})
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    salts = range(len(REQUESTS))
    mixed = llm.generate([vllm_prompt(items, salt) for items, salt in zip(REQUESTS, salts, strict=True)], greedy,
                         use_tqdm=False)
    long = [llm.generate([vllm_prompt(("video",), 7, LONG_QUESTION)], greedy, use_tqdm=False)[0] for _ in range(2)]
    hits = metric_total(llm, "vllm:prefix_cache_hits")
    then_image = llm.generate([vllm_prompt(("video", "image"), 7, text=VIDEO_THEN_IMAGE)], greedy, use_tqdm=False)
    image_hits = metric_total(llm, "vllm:prefix_cache_hits") - hits
    del llm
    expected = [hf_greedy(hf_vl, items, salt) for items, salt in zip(REQUESTS, salts, strict=True)]
    expected += [hf_greedy(hf_vl, ("video",), 7, LONG_QUESTION)] * 2
    expected += [hf_greedy(hf_vl, ("video", "image"), 7, text=VIDEO_THEN_IMAGE)]
    got = vl_chat.assert_outputs_equal_hf([*REQUESTS, "long", "long again", "video then image"],
                                          [*mixed, *long, *then_image], expected)
    assert got[0][1] != got[3][1], "different frames give different answers"
    config = hf_vl[0].config
    video_runs = vl_chat.image_runs(got[0][0], config.video_token_id)
    assert len(video_runs) == FRAMES, "one placeholder run per frame"
    vl_chat.assert_chunks_keep_images(trace, mixed, config.image_token_id)
    chunked = vl_chat.assert_chunks_keep_images(trace, mixed, config.video_token_id, one_item=True)
    assert chunked >= 1, "the image-plus-video prompt was prefilled in more than one chunk"
    video_end = vl_chat.image_runs(got[4][0], config.video_token_id)[-1][1]
    if caching:
        assert hits >= -(-video_end // 32) * 32, f"{hits} prefix-cache hit tokens: the repeat did not reuse the video"
        assert image_hits >= -(-video_end // 32) * 32, f"{image_hits} hit tokens: the image prompt missed the video"
        assert image_hits <= vl_chat.image_runs(got[6][0], config.image_token_id)[0][0], "the hit covers the image"
    else:
        assert hits == image_hits == 0


SERVE_VIDEOS: list[tuple[int, int, float]] = [(0, FRAMES, FPS), (3, 4, 2.0), (2, FRAMES, FPS)]
"""(salt, frames, fps) of each mp4 sent: two frames a second apart, four at 2 fps of which the
loader keeps the first and last (``num_frames`` 2: frames 0 and 3, at ``00:00`` and ``00:01``),
and the one sent after the corrupt bytes; the checkpoint tells their kinds (0, 3, 2) apart
(through the lossy mp4 it does not tell kinds 1 and 3 apart)."""
MEDIA_IO = {"video": {"num_frames": FRAMES}}
"""The server's ``--media-io-kwargs``: at most two frames per video, so a video fits one step."""


def test_serve_chat_with_mp4_video_urls_equals_transformers(tmp_path):
    """One ``vllm serve`` in lane mode (``MESH_DEVICE=TG``, 2 lanes of 4 rows) with the
    ``vllm.LLM`` test's step budget (256 tokens, chunks of at most 160: a two-frame video is
    145): two mp4 ``video_url`` chats and a text-only one at once, each
    equal to transformers on the frames vLLM's loader decodes from the same bytes, prompt ids
    included, and no prefill pass ended inside a video (the step trace); then corrupt video
    bytes are a 400 and the next video is served (Gemma 4's checkpoint: one server start)."""
    checkpoint = cached_gemma4_vl()
    hf_vl = vl_chat.load_hf(checkpoint)
    model = str(checkpoint)
    log, trace = tmp_path / "serve.log", tmp_path / "steps.jsonl"
    *videos, later = [vl_chat.video_part(vl_chat.mp4(vl_chat.video_frames(salt, count), fps))
                      for salt, count, fps in SERVE_VIDEOS]
    limits = {"image": 1, "video": {"count": 1, "num_frames": FRAMES, "width": 32, "height": 32}}
    lane_args, lane_env = vl_chat.lane_serve(4, trace)
    with serve(checkpoint, "--max-model-len", "512", *lane_args, "--block-size", "32",
               "--max-num-batched-tokens", "256", "--long-prefill-token-threshold", "160",
               "--limit-mm-per-prompt", json.dumps(limits), "--media-io-kwargs", json.dumps(MEDIA_IO),
               env=lane_env, log=log) as url:
        batch = [[part] for part in videos] + [[]]
        with concurrent.futures.ThreadPoolExecutor(len(batch)) as pool:
            answers = list(pool.map(lambda parts: vl_chat.post_chat(url, model, parts, MAX_TOKENS), batch))
        corrupt = vl_chat.post_chat(url, model, vl_chat.VIDEO_BAD_REQUESTS["corrupt video"], MAX_TOKENS)
        after = vl_chat.post_chat(url, model, [later], MAX_TOKENS)
    for response in [*answers, after]:
        assert response.status_code == 200, (response.text, log.read_text()[-3000:])
    decoded = [vl_chat.served_video(checkpoint, part, MEDIA_IO) for part in [*videos, later]]
    assert [video[1]["frames_indices"] for video in decoded] == [[0, 1], [0, 3], [0, 1]], "the loader's frames"
    on_video = [hf_greedy(hf_vl, ("video",), 0, video=video) for video in decoded]
    want = [*on_video[:2], hf_greedy(hf_vl, (), 0), on_video[2]]
    bodies = [response.json() for response in [*answers, after]]
    assert [b["prompt_token_ids"] for b in bodies] == [w[0] for w in want], "vLLM's expanded prompt ids equal HF's"
    mismatches = [(i, b["choices"][0]["token_ids"], w[1]) for i, (b, w) in enumerate(zip(bodies, want, strict=True))
                  if b["choices"][0]["token_ids"] != w[1]]
    assert not mismatches, mismatches
    assert len({tuple(w[1]) for w in on_video}) == 3, "different videos give different answers"
    video_token = hf_vl[0].config.video_token_id
    assert [len(vl_chat.image_runs(w[0], video_token)) for w in want] == [FRAMES, FRAMES, 0, FRAMES]
    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    for body in bodies[:2] + bodies[3:]:
        prompt = body["prompt_token_ids"]
        runs = vl_chat.image_runs(prompt, video_token)
        ends = vl_chat.chunk_ends(steps, body["id"], len(prompt))
        assert ends and ends[-1] == len(prompt), (body["id"], ends)
        assert not [e for e in ends if runs[0][0] < e < runs[-1][1]], (ends, runs)
    assert f"{vl_chat.LANES} lanes x 4 rows" in log.read_text()  # which lane a video lands on depends on arrival
    assert corrupt.status_code == 400, (corrupt.status_code, corrupt.text)
    assert corrupt.json()["error"]["message"]
