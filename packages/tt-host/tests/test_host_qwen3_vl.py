"""The host Qwen3-VL model against transformers' own modules and model.

A tiny random ``Qwen3VLForConditionalGeneration`` (three decoder layers, two DeepStack sets
from tower blocks 0 and 1, a 4x4 learned position table resampled to 8x8 and 4x6 patch grids)
is saved and loaded by both sides. The tower (merged features and every DeepStack set) and the
interleaved mRoPE rotation are compared at the module level; then prompts with 0, 1 and 2
images run through the host contract (every position's logits, decode with the returned
deltas, a chunk after an image) against HF's logits, and leaving DeepStack out is visible."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb
from vllm_tt_host.models import HOST_CAPABILITIES, HOST_MODELS
from vllm_tt_host.models.frame.vision import PixelNorm
from vllm_tt_host.models.qwen2_5_vl.media import Media, mrope_positions
from vllm_tt_host.models.qwen2_5_vl.model import MultimodalRotary
from vllm_tt_host.models.qwen3_vl.model import HostQwen3VLForConditionalGeneration
from vllm_tt_host.models.qwen3_vl.model import Qwen3VLConfig as HostConfig
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_testing.mrope_contract import (
    END,
    GRIDS,
    IMAGE,
    START,
    VIDEO,
    MropeCase,
    MropeRunner,
    frame_group_video_tests,
    pixels_u8,
    random_vl_fixtures,
)

TOL = 1e-4


def tiny_config() -> Qwen3VLConfig:
    return Qwen3VLConfig(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START, vision_end_token_id=END,
    )


checkpoint, hf, model = random_vl_fixtures(
    Qwen3VLForConditionalGeneration, HostQwen3VLForConditionalGeneration, tiny_config, "tiny-qwen3_vl")


def normalised(pixels: torch.Tensor) -> torch.Tensor:
    return PixelNorm().apply(pixels, 3)


@pytest.fixture(scope="module")
def case(hf, model) -> MropeCase:
    return MropeCase(hf, model, GRIDS, (START, IMAGE, END), TOL)


# ---- modules ---------------------------------------------------------------------------------
def test_vision_tower_and_deepstack_features_equal_transformers(hf, model):
    tower = model.decoder.tower
    images = [pixels_u8(1, GRIDS[0]), pixels_u8(2, GRIDS[1])]
    with torch.no_grad():
        expected = hf.model.visual(torch.cat([normalised(p) for p in images]), grid_thw=torch.tensor(GRIDS))
    ours = [tower(p, g) for p, g in zip(images, GRIDS, strict=True)]
    assert [len(o) for o in ours] == [3, 3], "merged features + one set per deepstack block"
    for k, reference in enumerate([expected.pooler_output, *expected.deepstack_features]):
        got = torch.cat([o[k] for o in ours])
        assert got.shape == (16 + 6, 64)
        assert torch.allclose(got, reference, atol=1e-5), (k, (got - reference).abs().max())
    assert (ours[0][1] - ours[0][0]).abs().max() > 1e-2, "the DeepStack sets are not the merged features"


def test_interleaved_mrope_rotation_equals_transformers(case, hf, model):
    ids = case.prompt(3, [5, 4, 3])
    input_ids = torch.tensor([ids])
    config = model.decoder.config
    assert isinstance(config, HostConfig)
    positions, delta = hf.model.get_rope_index(input_ids, mm_token_type_ids=(input_ids == IMAGE).int(),
                                               image_grid_thw=torch.tensor(GRIDS))
    ours, _ = mrope_positions(torch.tensor(ids), [Media(g, None) for g in GRIDS], config)
    assert torch.equal(ours, positions[:, 0]) and int(ours.max()) + 1 - len(ids) == int(delta)
    q = torch.randn(len(ids), 4, 16, generator=torch.Generator().manual_seed(0))
    cos, sin = hf.model.language_model.rotary_emb(q, positions)
    expected, _ = apply_rotary_pos_emb(q.transpose(0, 1)[None], q.transpose(0, 1)[None], cos, sin)
    rotary = MultimodalRotary(config)
    with rotary.at(ours):
        got = rotary.rotate(q, torch.arange(len(ids)))
    assert torch.allclose(got, expected[0].transpose(0, 1), atol=1e-6)
    assert config.mrope_axes().tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    rotary.axes = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2])  # Qwen2.5-VL's contiguous sections
    with rotary.at(ours):
        contiguous = rotary.rotate(q, torch.arange(len(ids)))
    assert (contiguous - expected[0].transpose(0, 1)).abs().max() > 1e-2


def test_registered_for_the_host_backend_and_takes_vllms_processor():
    assert HOST_MODELS["TTQwen3VLForConditionalGeneration"].endswith(":HostQwen3VLForConditionalGeneration")
    caps = check_model_class(HostQwen3VLForConditionalGeneration, owner="test")
    assert caps.supports_prefix_caching and not caps.supports_async_decode
    assert caps.modalities == ("image", "video")
    assert HOST_CAPABILITIES["TTQwen3VLForConditionalGeneration"]["modalities"] == ["image", "video"]
    assert HostQwen3VLForConditionalGeneration.supports_multimodal is True
    assert HostQwen3VLForConditionalGeneration.get_placeholder_str("image", 1) == (
        "<|vision_start|><|image_pad|><|vision_end|>"
    )


# ---- whole model -----------------------------------------------------------------------------
def test_every_position_logits_equal_transformers_with_0_1_and_2_images(case, model):
    runner = MropeRunner(model, GRIDS)
    for slot, (seed, lengths, seeds) in enumerate((case.TEXT, case.ONE, case.TWO)):
        ids = case.prompt(seed, lengths)
        logits, deltas = runner.prefill([(slot, ids, 0, len(ids), seeds)], return_all_logits=True)
        assert logits.shape[1] >= len(ids)
        case.assert_close(logits[0, : len(ids)], case.hf_logits(ids, seeds), slot)
    assert deltas.tolist() == [(4 - 16) + (3 - 6)]


def test_prefill_then_decode_with_deltas_equals_transformers(case):
    assert case.check_prefill_then_decode()[:3] == [0, 4 - 16, (4 - 16) + (3 - 6)]


def test_chunked_prefill_after_an_image_keeps_its_positions(case):
    """The second chunk computes the second image alone (its tower, its DeepStack sets)."""
    assert case.check_chunk_after_image() == (4 - 16) + (3 - 6)


def test_prefix_hit_past_images_sent_without_pixels(case):
    """No DeepStack for an image inside the prefix-cache hit: its positions are cached."""
    assert case.check_prefix_hit_past_images() == (4 - 16) + (3 - 6)


def test_leaving_deepstack_out_is_visible(case, model, monkeypatch):
    """A model that only replaces the placeholder embeddings (Qwen2.5-VL's way) is measurably off."""
    runner = MropeRunner(model, GRIDS)
    ids = case.prompt(5, [4, 6])
    ref = case.hf_logits(ids, [7])[-1]
    encode = model.decoder.encode
    monkeypatch.setattr(model.decoder, "encode", lambda pixels, grid: encode(pixels, grid)[:1])
    without, _ = runner.prefill([(0, ids, 0, len(ids), [7])])
    assert (without[0] - ref).abs().max() > 100 * TOL


# ---- video -----------------------------------------------------------------------------------
test_video_frame_group_positions, test_video_logits_whole_and_chunked = frame_group_video_tests(VIDEO)
"""A one-video and an image-then-video prompt: positions as ``get_rope_index``; every position's
logits within ``TOL`` of transformers, whole and cut between frame groups."""


@pytest.mark.parametrize(("vision", "match"), [
    ({"deepstack_visual_indexes": [0, 3]}, r"deepstack_visual_indexes=\[0, 3\].*block indices in 0\.\.2"),
    ({"num_position_embeddings": 12}, r"num_position_embeddings=12.*a square number"),
    ({"hidden_act": "relu"}, r"vision_config.hidden_act='relu'"),
])
def test_a_vision_config_the_host_tower_cannot_serve_is_refused_by_name(vision, match):
    config = tiny_config()
    for key, value in vision.items():
        setattr(config.vision_config, key, value)
    with pytest.raises(TTConfigError, match=match):
        HostConfig.read(config, "qwen3")
