"""The host Qwen2.5-VL model against transformers' own modules and model.

A tiny random ``Qwen2_5_VLForConditionalGeneration`` is saved and loaded by both sides. The
vision tower is compared module by module on images whose window partition differs from the
whole image (a tiny end-to-end model does not show full-instead-of-window attention), the
mRoPE indices against ``get_rope_index``, the uint8 normalisation against the HF image
processor; then whole prompts with 0, 1 and 2 images run through the host contract (prefill,
chunked prefill, decode with the returned deltas) against HF's logits."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import PixelNorm
from vllm_tt_host.models.qwen2_5_vl.media import Media, mrope_positions
from vllm_tt_host.models.qwen2_5_vl.model import (
    HostQwen2_5_VLForConditionalGeneration,
    Qwen25VLConfig,
)
from vllm_tt_host.models.qwen2_5_vl.vision import VisionTower
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_testing.mrope_contract import (
    END,
    GRIDS,
    IMAGE,
    START,
    VIDEO,
    MropeCase,
    MropeRunner,
    pixels_u8,
    random_vl_fixtures,
    vl_prompt,
)


def tiny_config() -> Qwen2_5_VLConfig:
    return Qwen2_5_VLConfig(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=16, out_hidden_size=64,
                           fullatt_block_indexes=[1]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
    )


checkpoint, hf, model = random_vl_fixtures(
    Qwen2_5_VLForConditionalGeneration, HostQwen2_5_VLForConditionalGeneration, tiny_config, "tiny-qwen2_5_vl")


def normalised(pixels: torch.Tensor) -> torch.Tensor:
    return PixelNorm().apply(pixels, 3)


def prompt(seed: int, lengths: list[int], grids: tuple[tuple[int, int, int], ...] = GRIDS) -> list[int]:
    return vl_prompt(seed, lengths, grids, START, IMAGE, END)


# ---- modules ---------------------------------------------------------------------------------
def test_vision_tower_equals_transformers_including_its_windows(hf, model):
    tower = model.decoder.tower
    images = [pixels_u8(1, GRIDS[0]), pixels_u8(2, GRIDS[1])]
    with torch.no_grad():
        expected = hf.model.visual(torch.cat([normalised(p) for p in images]), grid_thw=torch.tensor(GRIDS)).pooler_output
    ours = torch.cat([tower(p, g) for p, g in zip(images, GRIDS, strict=True)])
    assert ours.shape == (16 + 6, 64)
    assert torch.allclose(ours, expected, atol=1e-5), (ours - expected).abs().max()
    everywhere_full = VisionTower(dataclasses.replace(tower.config, full_attention_blocks=(0, 1, 2)), tower.weights,
                                  tower.norm)
    wrong = torch.cat([everywhere_full(p, g) for p, g in zip(images, GRIDS, strict=True)])
    assert (wrong - expected).abs().max() > 100 * (ours - expected).abs().max() + 1e-3, (
        "full attention in the window blocks must be visible at the module level"
    )


def test_uint8_pixels_are_normalised_as_the_hf_image_processor_does():
    processor = Qwen2VLImageProcessor(patch_size=4, temporal_patch_size=2, merge_size=2,
                                      size={"shortest_edge": 64, "longest_edge": 4096})
    image = np.random.default_rng(0).integers(0, 256, (32, 24, 3), dtype=np.uint8)
    reference = processor(images=[image], return_tensors="pt")
    raw = processor(images=[image], return_tensors="pt", do_rescale=False, do_normalize=False)
    assert reference["image_grid_thw"].tolist() == [[1, 8, 6]]
    ours = PixelNorm().apply(raw["pixel_values"].round().to(torch.uint8), 3)
    assert torch.allclose(ours, reference["pixel_values"], atol=1e-5)


def test_mrope_indices_and_delta_equal_get_rope_index(hf, model):
    ids = prompt(3, [5, 4, 3])
    input_ids = torch.tensor([ids])
    expected, delta = hf.model.get_rope_index(input_ids, mm_token_type_ids=(input_ids == IMAGE).int(),
                                              image_grid_thw=torch.tensor(GRIDS))
    config = model.decoder.config
    assert isinstance(config, Qwen25VLConfig)
    ours, runs = mrope_positions(torch.tensor(ids), [Media(g, None) for g in GRIDS], config)
    assert torch.equal(ours, expected[:, 0])
    assert int(ours.max()) + 1 - len(ids) == int(delta) != 0
    assert [r.stop - r.first for r in runs] == [16, 6]


def test_a_run_the_tokens_end_inside_takes_the_whole_runs_indices_and_a_short_one_is_refused(model):
    """A chunk may end inside an image (a model declaring ``chunked_mm_input``): its tokens
    keep the indices they have in the whole prompt. A run of the wrong length elsewhere is an
    error."""
    ids, items, config = prompt(3, [5, 4]), [Media(GRIDS[0], None)], model.decoder.config
    whole, _ = mrope_positions(torch.tensor(ids), items, config)
    cut = ids[:-6]  # ends inside the image's placeholders
    ours, runs = mrope_positions(torch.tensor(cut), items, config)
    assert torch.equal(ours, whole[:, : len(cut)]) and runs[-1].stop == len(cut)
    short = ids[: ids.index(IMAGE)] + ids[ids.index(IMAGE) + 1 :]  # one placeholder fewer, then text
    with pytest.raises(HostModelInputError, match="has 15 image tokens, item 0 .* gives 16 image tokens there"):
        mrope_positions(torch.tensor(short), items, config)


def test_registered_for_the_host_backend_and_takes_vllms_processor():
    assert HOST_MODELS["TTQwen2_5_VLForConditionalGeneration"].endswith(":HostQwen2_5_VLForConditionalGeneration")
    caps = check_model_class(HostQwen2_5_VLForConditionalGeneration, owner="test")
    assert caps.supports_prefix_caching and not caps.supports_async_decode
    assert HostQwen2_5_VLForConditionalGeneration.supports_multimodal is True
    assert HostQwen2_5_VLForConditionalGeneration.get_placeholder_str("image", 1) == (
        "<|vision_start|><|image_pad|><|vision_end|>"
    )


# ---- whole model -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def case(hf, model) -> MropeCase:
    return MropeCase(hf, model, GRIDS, (START, IMAGE, END))


def test_prefill_and_decode_logits_equal_transformers_with_0_1_and_2_images(case):
    assert case.check_prefill_then_decode()[:3] == [0, 4 - 16, (4 - 16) + (3 - 6)]


def test_chunked_prefill_continues_after_an_image_with_its_positions(case):
    assert case.check_chunk_after_image() == (4 - 16) + (3 - 6)


def test_prefix_hit_past_images_sent_without_pixels(case, model):
    """vLLM keeps only ``image_grid_thw`` of an image inside the prefix-cache hit (no pixels):
    the tokens after it still take their mRoPE positions from its grid, the later image runs its
    tower, and the logits and delta equal HF's; without any pixels in the call (both images
    cached) the same holds. An image the pass computes without pixels is refused."""
    assert case.check_prefix_hit_past_images() == (4 - 16) + (3 - 6)
    ids, past_first = case.two_image_prompt()
    with pytest.raises(HostModelInputError, match=r"row 0: image placeholder runs \[1\] are computed from position 23"):
        MropeRunner(model, GRIDS).prefill([(3, ids, past_first, len(ids), [8, None])])


def test_different_images_change_the_logits(model):
    runner = MropeRunner(model, GRIDS)
    ids = prompt(5, [4, 6])
    a, _ = runner.prefill([(0, ids, 0, len(ids), [7])])
    b, _ = runner.prefill([(1, ids, 0, len(ids), [70])])
    assert (a - b).abs().max() > 1e-2


# ---- video -----------------------------------------------------------------------------------
VIDEO_GRID = (4, 4, 4)
"""Eight frames (four temporal patches) of 16x16 pixels: 16 video tokens, temporal index 0, 4, 8, 12."""
SECONDS_PER_GRID = 1.0


def video_prompt() -> tuple[list[int], list[int]]:
    """Text, a video, text, an image, text: the ids and each token's HF ``mm_token_type_ids``."""
    gen = torch.Generator().manual_seed(11)
    text = [torch.randint(3, 290, (n,), generator=gen).tolist() for n in (3, 4, 5)]
    ids = (text[0] + [START] + [VIDEO] * 16 + [END] + text[1] + [START] + [IMAGE] * 16 + [END] + text[2])
    return ids, [2 if t == VIDEO else 1 if t == IMAGE else 0 for t in ids]


def video_kwargs() -> dict[str, list[list[Any] | None]]:
    """The runner's item lists for ``video_prompt``'s one row: the video's place is None in the
    image keys and the image's in the video keys."""
    return {
        "pixel_values": [[None, pixels_u8(21, GRIDS[0])]], "image_grid_thw": [[None, torch.tensor(GRIDS[0])]],
        "pixel_values_videos": [[pixels_u8(20, VIDEO_GRID), None]], "video_grid_thw": [[torch.tensor(VIDEO_GRID), None]],
        "second_per_grid_ts": [[torch.tensor([SECONDS_PER_GRID]), None]],
    }


def hf_video_logits(hf) -> tuple[torch.Tensor, int]:
    ids, types = video_prompt()
    with torch.no_grad():
        out = hf(input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]),
                 pixel_values_videos=normalised(pixels_u8(20, VIDEO_GRID)), video_grid_thw=torch.tensor([VIDEO_GRID]),
                 second_per_grid_ts=torch.tensor([SECONDS_PER_GRID]),
                 pixel_values=normalised(pixels_u8(21, GRIDS[0])), image_grid_thw=torch.tensor([GRIDS[0]]))
    return out.logits[0], int(hf.model.rope_deltas)


def test_video_mrope_indices_step_with_its_clock_as_get_rope_index(hf, model):
    """The temporal index of a video token steps by ``tokens_per_second * second_per_grid_ts``
    (4 here), an image's stays at its start; a video of the same size placed as an image would
    give other indices."""
    ids, types = video_prompt()
    expected, delta = hf.model.get_rope_index(
        torch.tensor([ids]), mm_token_type_ids=torch.tensor([types]), image_grid_thw=torch.tensor([GRIDS[0]]),
        video_grid_thw=torch.tensor([VIDEO_GRID]), second_per_grid_ts=torch.tensor([SECONDS_PER_GRID]))
    media = [Media(VIDEO_GRID, None, SECONDS_PER_GRID), Media(GRIDS[0], None)]
    ours, runs = mrope_positions(torch.tensor(ids), media, model.decoder.config)
    assert torch.equal(ours, expected[:, 0])
    assert int(ours.max()) + 1 - len(ids) == int(delta)
    assert sorted(set(ours[0, 4:20].tolist())) == [4, 8, 12, 16]
    assert [(r.item, r.stop - r.first) for r in runs] == [(0, 16), (1, 16)]
    with pytest.raises(HostModelInputError, match="16 video tokens, item 0 \\(image"):
        mrope_positions(torch.tensor(ids), [Media(VIDEO_GRID, None), Media(GRIDS[0], None)], model.decoder.config)


def test_video_and_image_prompt_logits_equal_transformers_whole_and_chunked(hf, model):
    """Every position's logits of a prompt with a video then an image equal HF's, in one pass
    and as a second chunk starting after the video (its tower skipped, its grid still giving
    the positions); the returned delta is HF's."""
    expected, hf_delta = hf_video_logits(hf)
    ids, _ = video_prompt()
    runner = MropeRunner(model, GRIDS)

    def prefill(start: int, kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return model.prefill_forward(
            tokens=torch.tensor([ids], dtype=torch.int32), page_table=runner.table[[0]], kv_cache=runner.kv,
            prompt_lens=[len(ids)], start_pos=[start], empty_slots=[0], return_all_logits=True, **kwargs)

    whole, deltas = prefill(0, video_kwargs())
    worst = float((whole[0, -len(ids):] - expected).abs().max())
    assert worst < 1e-4, worst
    assert deltas.tolist() == [hf_delta] and hf_delta != 0
    past_video = 3 + 18
    tail_kwargs = video_kwargs()
    tail_kwargs["pixel_values_videos"] = [[None, None]]  # as vLLM: computed before, so no pixels
    tail, deltas = prefill(past_video, tail_kwargs)
    worst = float((tail[0, -(len(ids) - past_video):] - expected[past_video:]).abs().max())
    assert worst < 1e-4, worst
    assert deltas.tolist() == [hf_delta]
