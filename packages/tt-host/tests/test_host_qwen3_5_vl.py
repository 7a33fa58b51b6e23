"""The host Qwen 3.5 vision-language model against transformers' ``Qwen3_5ForConditionalGeneration``.

A tiny random checkpoint (three gated delta-net layers then a gated full-attention one, rope on
a quarter of each head with the interleaved mRoPE split, a Qwen3-VL-style tower without
DeepStack over 8x8 and 4x6 patch grids) is saved and loaded by both sides. The tower is
compared at the module level; then prompts with 0, 1 and 2 images run through the host
contract over the hybrid KV (paged K/V for the attention layer, one recurrent-state block per
request for each delta-net layer): every position's logits, decode with the returned mRoPE
deltas, a chunk ending between the images (the state and the positions carry on) and decode
steps after it, passes cut inside the images; plain rope in place of mRoPE is visibly wrong."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration
from vllm_tt_host.models import HOST_CAPABILITIES, HOST_MODELS
from vllm_tt_host.models.frame.vision import PixelNorm, image_runs
from vllm_tt_host.models.qwen3_5_vl.model import HostQwen3_5ForConditionalGeneration, Qwen3_5VLConfig
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_testing.mrope_contract import (
    BLOCK,
    END,
    GRIDS,
    IMAGE,
    NUM_BLOCKS,
    START,
    VIDEO,
    MropeCase,
    frame_group_video_tests,
    pixels_u8,
    random_vl_fixtures,
)

TOL = 1e-4


def tiny_config() -> Qwen3_5Config:
    return Qwen3_5Config(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
                         linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                         linear_value_head_dim=16, linear_conv_kernel_dim=4,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                          "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                           num_position_embeddings=16),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
    )


checkpoint, hf, model = random_vl_fixtures(
    Qwen3_5ForConditionalGeneration, HostQwen3_5ForConditionalGeneration, tiny_config, "tiny-qwen3_5_vl")


def layer_specs(model: Any) -> list[Any]:
    """vLLM's hybrid plan as the runner hands it over: a state pool per delta-net layer, paged K/V."""
    cfg = model.config
    states = ((NUM_BLOCKS, *cfg.delta.conv_state_shape), (NUM_BLOCKS, *cfg.delta.recurrent_state_shape))
    attention = (NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim)
    return [(states, (torch.float32, torch.float32), 0) if cfg.linear(i) else (attention, torch.float32, 0)
            for i in range(cfg.num_layers)]


@pytest.fixture(scope="module")
def case(hf, model) -> MropeCase:
    return MropeCase(hf, model, GRIDS, (START, IMAGE, END), TOL, layer_specs)


# ---- modules ---------------------------------------------------------------------------------
def test_vision_tower_equals_transformers(hf, model):
    tower = model.decoder.tower
    images = [pixels_u8(1, GRIDS[0]), pixels_u8(2, GRIDS[1])]
    with torch.no_grad():
        expected = hf.model.visual(torch.cat([PixelNorm().apply(p, 3) for p in images]),
                                   grid_thw=torch.tensor(GRIDS)).pooler_output
    ours = [tower(p, g) for p, g in zip(images, GRIDS, strict=True)]
    assert [len(o) for o in ours] == [1, 1], "merged features only: no DeepStack sets"
    got = torch.cat([o[0] for o in ours])
    assert got.shape == (16 + 6, 64)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


def test_config_reads_the_text_side_and_the_images():
    config = Qwen3_5VLConfig.read(tiny_config())
    assert config.layer_kinds == ("linear_attention",) * 3 + ("full_attention",)
    assert (config.rotary_dim, config.mrope_section, config.image_token_id) == (8, (2, 1, 1), IMAGE)
    assert config.mrope_axes().tolist() == [0, 1, 2, 0]
    assert config.vision.deepstack_blocks == ()


def test_an_mrope_split_that_does_not_cover_the_rotary_part_is_refused():
    config = tiny_config()
    config.text_config.rope_parameters["mrope_section"] = [8, 4, 4]  # a whole head's pairs, not the quarter's
    with pytest.raises(TTConfigError, match=r"mrope_section=\[8, 4, 4\].*summing to the 4 rotated pairs"):
        Qwen3_5VLConfig.read(config)


def test_registered_for_the_host_backend_and_takes_vllms_processor():
    arch = "TTQwen3_5ForConditionalGeneration"
    assert HOST_MODELS[arch].endswith("qwen3_5_vl.model:HostQwen3_5ForConditionalGeneration")
    caps = check_model_class(HostQwen3_5ForConditionalGeneration, owner="test")
    assert caps.kv_cache_kinds == ("full_attention", "recurrent_state")
    assert caps.supports_prefix_caching and caps.chunked_mm_input
    assert not caps.supports_async_decode and not caps.supports_verify_decode
    assert HOST_CAPABILITIES[arch]["supports_prefix_caching"] and HOST_CAPABILITIES[arch]["chunked_mm_input"]
    assert HOST_CAPABILITIES[arch]["kv_cache_kinds"] == ["full_attention", "recurrent_state"]
    assert caps.modalities == ("image", "video") and HOST_CAPABILITIES[arch]["modalities"] == ["image", "video"]
    assert HostQwen3_5ForConditionalGeneration.supports_multimodal is True
    assert HostQwen3_5ForConditionalGeneration.get_placeholder_str("image", 1) == (
        "<|vision_start|><|image_pad|><|vision_end|>"
    )


# ---- whole model -----------------------------------------------------------------------------
def test_every_position_logits_equal_transformers_with_0_1_and_2_images(case):
    runner = case.runner()
    for slot, (seed, lengths, seeds) in enumerate((case.TEXT, case.ONE, case.TWO)):
        ids = case.prompt(seed, lengths)
        logits, deltas = runner.prefill([(slot, ids, 0, len(ids), seeds)], return_all_logits=True)
        case.assert_close(logits[0, : len(ids)], case.hf_logits(ids, seeds), slot)
    assert deltas.tolist() == [(4 - 16) + (3 - 6)]


def test_prefill_then_decode_with_deltas_equals_transformers(case):
    assert case.check_prefill_then_decode()[:3] == [0, 4 - 16, (4 - 16) + (3 - 6)]


def test_chunked_prefill_between_images_then_decode_equals_transformers(case):
    """The second chunk computes the second image and continues the delta-net states the
    first left; three decode steps then continue both the states and the mRoPE delta."""
    assert case.check_chunk_after_image() == (4 - 16) + (3 - 6)
    runner = case.runner()
    ids, cut = case.two_image_prompt()
    seeds = case.TWO[2]
    runner.prefill([(2, ids[:cut], 0, cut, seeds)])
    last, deltas = runner.prefill([(2, ids, cut, len(ids), seeds)])
    token = int(last[0].argmax())
    for _ in range(3):
        step = runner.decode({2: (token, len(ids))}, [0, 0, int(deltas[0]), 0])
        ids = ids + [token]
        case.assert_close(step[2], case.hf_logits(ids, seeds)[-1], ("decode at", len(ids)))
        token = int(step[2].argmax())


def test_passes_cut_inside_each_image_equal_transformers_at_every_position(case):
    """``chunked_mm_input`` (vLLM's align mode ends chunks on block boundaries, inside an image
    if need be): a pass ending inside the first image, one from there ending inside the second,
    then the rest; each embeds its images whole and places the part it computes, at the whole
    runs' mRoPE indices. Every position equals HF's, and the last delta is the prompt's."""
    seed, lengths, seeds = case.TWO
    ids = case.prompt(seed, lengths)
    (first, _), (second, _) = image_runs(torch.tensor(ids), IMAGE)
    runner, start, got = case.runner(), 0, []
    for end in (first + 5, second + 2, len(ids)):
        logits, deltas = runner.prefill([(1, ids[:end], start, end, seeds)], return_all_logits=True)
        got.append(logits[0, : end - start])
        start = end
    case.assert_close(torch.cat(got), case.hf_logits(ids, seeds), "passes cut inside the images")
    assert deltas.tolist() == [(4 - 16) + (3 - 6)]


def test_plain_rope_in_place_of_mrope_is_visible(case, model, monkeypatch):
    """The image tokens' grid coordinates matter: rotating every token of a prefill from 0 at
    its cache position (the text model's rope) moves the last logits far beyond the tolerance."""
    ids = case.prompt(*case.ONE[:2])
    ref = case.hf_logits(ids, case.ONE[2])[-1]
    mrope = model.decoder.mrope
    at = mrope.at
    monkeypatch.setattr(mrope, "at", lambda positions: at(torch.arange(positions.shape[1]).expand(3, -1)))
    got, _ = case.runner().prefill([(0, ids, 0, len(ids), case.ONE[2])])
    assert (got[0] - ref).abs().max() > 100 * TOL


# ---- video -----------------------------------------------------------------------------------
test_video_frame_group_positions, test_video_logits_whole_and_chunked = frame_group_video_tests(VIDEO)
"""A one-video and an image-then-video prompt: positions as ``get_rope_index``; every position's
logits within ``TOL`` of transformers, whole and cut between frame groups."""
