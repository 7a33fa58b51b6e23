"""Qwen-VL video through vLLM's engine on the host mesh backend: Qwen2.5-VL
(``Qwen2_5_VLForConditionalGeneration``), Qwen3-VL (``Qwen3VLForConditionalGeneration``) and
Qwen 3.5 (``Qwen3_5ForConditionalGeneration``), each on its tiny trained checkpoint.

Videos go in as frames (``multi_modal_data={"video": (frames, metadata)}``: an ``[F, H, W, 3]``
uint8 array and its clock, the form vLLM's Qwen-VL processors take; no video file is decoded,
so the frames vLLM and transformers see are the same by construction). vLLM's processor turns
them into ``pixel_values_videos`` and ``video_grid_thw`` (Qwen2.5-VL: and
``second_per_grid_ts``, the video's temporal index stepping with its clock; Qwen3-VL and 3.5:
one placeholder run per temporal patch with its ``<t seconds>`` timestamp text before it, the
text advancing the positions); the host model runs the tower over the frames. Greedy outputs
equal transformers' ``generate()`` token for token for text-only, one-video, and
image-plus-video prompts side by side, prefilled in chunks of at most 64 tokens that never end
inside an image, a video or one of its frame groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_tt_host.models import HOST_CAPABILITIES
from vllm_tt_testing.checkpoints import cached_qwen3_5_vl, cached_qwen3_vl, cached_qwen_vl
from vllm_tt_testing.tiny_vl import QUESTION

from tests.e2e import vl_chat
from tests.e2e.helpers import offline_llm

pytestmark = pytest.mark.e2e

MAX_TOKENS = 12
FRAMES, FPS = vl_chat.VIDEO_FRAMES, vl_chat.VIDEO_FPS
"""Four frames at 2 fps: two temporal patches of one second each (video tokens at temporal
index 0 and ``tokens_per_second``)."""
VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
REQUESTS: list[tuple[str, ...]] = [("video",), (), ("image", "video"), ("video",)]
"""The items of each prompt, in prompt order; the two one-video prompts have different frames."""


CHECKPOINTS: dict[str, Any] = {
    "Qwen2_5_VLForConditionalGeneration": cached_qwen_vl,
    "Qwen3VLForConditionalGeneration": cached_qwen3_vl,
    "Qwen3_5ForConditionalGeneration": cached_qwen3_5_vl,
}
"""Each family's tiny trained checkpoint (the ones its image tests use)."""
@pytest.fixture(scope="module", params=list(CHECKPOINTS))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(arch) -> Path:
    return CHECKPOINTS[arch]()


@pytest.fixture(scope="module")
def hf_vl(checkpoint):
    return vl_chat.load_hf(checkpoint)


def metadata() -> dict[str, Any]:
    return {"fps": FPS, "duration": FRAMES / FPS, "total_num_frames": FRAMES, "frames_indices": list(range(FRAMES)),
            "video_backend": "opencv", "do_sample_frames": False}


def prompt_text(items: tuple[str, ...]) -> str:
    """The chat prompt; one with two items leads with text, so that a chunk may end before them."""
    parts = "".join(VIDEO if m == "video" else IMAGE for m in items)
    lead = " ".join([QUESTION] * 3) if len(items) > 1 else ""
    return f"<|im_start|>user\n{lead}{parts}{QUESTION}<|im_end|>\n<|im_start|>assistant\n"


def hf_generate(hf_vl: tuple[Any, Any], items: tuple[str, ...], salt: int) -> tuple[list[int], list[int]]:
    from transformers.video_utils import VideoMetadata

    model, processor = hf_vl
    media: dict[str, Any] = {}
    if "image" in items:
        media["images"] = vl_chat.images((2,), salt)
    if "video" in items:
        meta = {k: v for k, v in metadata().items() if k != "do_sample_frames"}
        media.update(videos=[vl_chat.video_frames(salt)], video_metadata=[VideoMetadata(**meta)], do_sample_frames=False)
    inputs = processor(text=[prompt_text(items)], return_tensors="pt", **media)
    return vl_chat.greedy_of(model, inputs, MAX_TOKENS)


def vllm_prompt(items: tuple[str, ...], salt: int) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if "image" in items:
        data["image"] = vl_chat.images((2,), salt)
    if "video" in items:
        data["video"] = [(vl_chat.video_frames(salt), metadata())]
    return vl_chat.item_prompt(prompt_text(items), data)


def test_llm_generate_with_videos_equals_transformers_chunked(arch, checkpoint, hf_vl, tmp_path):
    """Four requests at once on 4 decode rows, prefill chunks of at most 64 tokens
    (``long_prefill_token_threshold``; the step budget must hold vLLM's size of a video item, the
    model length): the image-plus-video prompt (83 tokens with Qwen2.5-VL, more with the
    timestamp text) is prefilled in chunks that end outside its image and its video; Qwen 3.5
    (``chunked_mm_input``) in chunks of which one ends inside its video."""
    from vllm import SamplingParams

    trace = tmp_path / "steps.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TT_STEP_TRACE", str(trace))
        llm = offline_llm(model=str(checkpoint), max_model_len=128, max_num_seqs=4, max_num_batched_tokens=128,
                          long_prefill_token_threshold=64, enable_chunked_prefill=True, enable_prefix_caching=False,
                          limit_mm_per_prompt={"image": 1, "video": {"count": 1, "num_frames": FRAMES,
                                                                     "width": 32, "height": 32}},
                          seed=0, additional_config={"tt": {"mesh_backend": "host"}})
    salts = range(len(REQUESTS))
    results = llm.generate([vllm_prompt(items, salt) for items, salt in zip(REQUESTS, salts, strict=True)],
                           SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)
    del llm
    expected = [hf_generate(hf_vl, items, salt) for items, salt in zip(REQUESTS, salts, strict=True)]
    got = vl_chat.assert_outputs_equal_hf(REQUESTS, results, expected)
    assert got[0][1] != got[3][1], "different frames give different answers"
    config = hf_vl[0].config
    if HOST_CAPABILITIES[f"TT{arch}"].get("chunked_mm_input"):  # vLLM may end a pass inside an item: it did
        passes = vl_chat.item_passes(trace, results, config.video_token_id, one_item=True)
        assert [ends for ends, runs in passes if vl_chat.cuts(ends, runs)], passes
    else:
        assert vl_chat.assert_chunks_keep_images(trace, results, config.video_token_id, one_item=True) >= 1
        vl_chat.assert_chunks_keep_images(trace, results, config.image_token_id)
    frame_groups = 1 if arch == "Qwen2_5_VLForConditionalGeneration" else FRAMES // 2
    video_runs = [len(vl_chat.image_runs(ids, config.video_token_id)) for ids, _ in got if config.video_token_id in ids]
    assert video_runs == [frame_groups] * 3, ("one placeholder run per temporal patch", video_runs)
