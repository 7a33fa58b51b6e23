"""The host Gemma 4 vision-language model (``TTGemma4ForConditionalGeneration``) against
transformers' own ``Gemma4ForConditionalGeneration``.

A tiny random model (the recipe's processor and config: 4-pixel patches pooled 3x3, an E-series
text side of sliding and full layers with KV-shared last layers and per-layer inputs; the tower's
standardisation and position tables randomised) is saved and loaded by both sides, once with
bidirectional attention over each image on the sliding layers (``use_bidirectional_attention:
"vision"``) and once causal. The tower is compared image by image (a square image makes 64
image tokens, a wide one 55); then prompts with 0, 1 and 2 images run through the hybrid-KV
contract (prefill with ``pixel_values`` and ``pixel_position_ids``, chunks cut between images,
prefix-cache starts, decode) against HF's logits at every position."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import image_runs
from vllm_tt_host.models.gemma4.embedder import UnifiedVisionConfig
from vllm_tt_host.models.gemma4.unified import Gemma4UnifiedConfig, HostGemma4UnifiedForConditionalGeneration
from vllm_tt_host.models.gemma4.vl import Gemma4VLConfig, HostGemma4ForConditionalGeneration
from vllm_tt_host.tiny import corpus_text
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.errors import TTConfigError, TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.contract_driver import ContractDriver
from vllm_tt_testing.parity import assert_every_position_matches
from vllm_tt_testing.tiny_gemma4_vl import build_processor, random_gemma4
from vllm_tt_testing.tiny_vl import synthetic_image, user_message

BLOCK = 16
NUM_BLOCKS = 96
WIDTH = 24
"""Page-table width (blocks per row): 384 positions."""
WIDE = (32, 64)
UNIFIED = "unified"
VARIANTS = ("images-both-ways", "causal", UNIFIED)
"""The tiny models: Gemma 4 with ``use_bidirectional_attention`` ``"vision"`` and null, and
Gemma 4 Unified (``"vision"``)."""
HF_CLASSES = (Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration)
HOST_CLASSES = (HostGemma4ForConditionalGeneration, HostGemma4UnifiedForConditionalGeneration)
"""Gemma 4's and Gemma 4 Unified's."""


@pytest.fixture(scope="module", params=VARIANTS)
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def processor(variant):
    paragraphs = [p.strip() for p in corpus_text().split("\n\n") if p.strip()]
    return build_processor(paragraphs, unified=variant == UNIFIED)


@pytest.fixture(scope="module")
def checkpoint(variant, processor, tmp_path_factory):
    hf = random_gemma4(processor, bidirectional=None if variant == "causal" else "vision", unified=variant == UNIFIED)
    folder = tmp_path_factory.mktemp("tiny-gemma4-vl")
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf(variant, checkpoint):
    return HF_CLASSES[variant == UNIFIED].from_pretrained(checkpoint, dtype=torch.float32,
                                                          attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model(variant, checkpoint):
    config = AutoConfig.from_pretrained(checkpoint)
    return HOST_CLASSES[variant == UNIFIED].initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), 4,
                                                                  WIDTH * BLOCK)


def driver(model) -> ContractDriver:
    return ContractDriver.per_layer(model, NUM_BLOCKS, BLOCK, width=WIDTH, spoil="nan")


def request(processor, sizes: list[tuple[int, int]], seed: int, question: str = "what is it?") -> dict:
    """The processor's inputs for one chat prompt with images of ``sizes``."""
    pictures = [Image.fromarray(synthetic_image(seed + k, 10 * seed + k, size)) for k, size in enumerate(sizes)]
    return dict(processor(text=[processor.apply_chat_template(user_message(len(sizes), question),
                                                              add_generation_prompt=True, tokenize=False)],
                          images=[pictures] if pictures else None, return_tensors="pt", add_special_tokens=False))


def per_image(inputs: dict) -> dict:
    """The runner's image kwargs of one row: one tensor per image."""
    if "pixel_values" not in inputs:
        return {}
    return {"pixel_values": [list(inputs["pixel_values"])], "pixel_position_ids": [list(inputs["image_position_ids"])]}


def hf_logits(hf, inputs: dict, ids: list[int] | None = None, mm_types: bool = True) -> torch.Tensor:
    """HF's logits at every position of ``ids`` (default: the prompt) with the request's images;
    ``mm_token_type_ids`` marks the image tokens, as the processor does, unless ``mm_types`` is off."""
    ids = inputs["input_ids"][0].tolist() if ids is None else ids
    input_ids = torch.tensor([ids])
    kwargs = {k: inputs[k] for k in ("pixel_values", "image_position_ids") if k in inputs}
    if mm_types:
        kwargs["mm_token_type_ids"] = (input_ids == hf.config.image_token_id).long()
    with torch.no_grad():
        return hf(input_ids=input_ids, **kwargs).logits[0]


def prompt_of(inputs: dict) -> list[int]:
    return inputs["input_ids"][0].tolist()


# ---- modules ---------------------------------------------------------------------------------


def test_vision_tower_matches_transformers(model, hf, processor):
    """Square and wide images (64 and 55 image tokens) through the tower and embedder."""
    inputs = request(processor, [(32, 32), WIDE], 1)
    with torch.no_grad():
        expected = hf.model.get_image_features(inputs["pixel_values"], inputs["image_position_ids"]).pooler_output
    for k, want in enumerate(expected):
        got = model.decoder.tower(inputs["pixel_values"][k], inputs["image_position_ids"][k])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert [e.shape[0] for e in expected] == [64, 55]
    assert expected[0].abs().mean() > 0.5


# ---- the whole model through the contract ----------------------------------------------------


@pytest.mark.parametrize("sizes", [[], [(32, 32)], [WIDE, (32, 32)]], ids=["text", "one-image", "two-images"])
def test_every_position_matches_transformers(model, hf, processor, sizes):
    """Every position's logits of a prompt with 0, 1 and 2 images equal HF's (1e-4)."""
    inputs = request(processor, sizes, 2)
    assert_every_position_matches(prompt_logits(model, inputs), hf_logits(hf, inputs))


def prompt_logits(model, inputs: dict) -> torch.Tensor:
    """Every position's logits of the request's prompt, prefilled in one chunk."""
    d = driver(model)
    d.add(0, prompt_of(inputs))
    return d.prefill([(0, len(prompt_of(inputs)))], return_all_logits=True, **per_image(inputs))[0]


def test_image_attention_follows_the_config(model, hf, processor):
    """With ``"vision"`` HF's reading without ``mm_token_type_ids`` (causal over the images) is
    far off at the image positions, and ours equals the bidirectional one; a causal checkpoint
    ignores them."""
    inputs = request(processor, [(32, 32), (32, 32)], 3)
    got, expected = prompt_logits(model, inputs), hf_logits(hf, inputs)
    causal = hf_logits(hf, inputs, mm_types=False)
    at_images = torch.tensor(prompt_of(inputs)) == hf.config.image_token_id
    if model.config.images_both_ways:
        assert (causal - expected)[at_images].abs().max() > 100 * (got - expected).abs().max()
    else:
        torch.testing.assert_close(causal, expected)


FRAMES = 2


def video_request(processor, seed: int, images: int = 0, question: str = "what is it?",
                  video_first: bool = False) -> dict:
    """The processor's inputs for a chat prompt with ``images`` images, then a video of
    ``FRAMES`` frames a second apart (``video_first``: the video, then one image)."""
    from transformers.video_utils import VideoMetadata

    text = processor.apply_chat_template(user_message(images, question), add_generation_prompt=True, tokenize=False)
    before = processor.image_token if video_first else question
    text = text.replace(before, processor.video_token + before, 1)
    frames = np.stack([synthetic_image(seed + i, 10 * seed + i, (32, 32)) for i in range(FRAMES)])
    pictures = [Image.fromarray(synthetic_image(seed + 5, 3 * seed, (32, 32)))] * images
    meta = VideoMetadata(fps=1.0, duration=FRAMES, total_num_frames=FRAMES, frames_indices=list(range(FRAMES)))
    return dict(processor(text=[text],
                          images=[pictures] if pictures else None, videos=[frames], video_metadata=[meta],
                          do_sample_frames=False, return_tensors="pt", add_special_tokens=False))


def per_item(inputs: dict, video_first: bool = False) -> dict:
    """The runner's kwargs of one row with its images and one video (last, or ``video_first``):
    one entry per item."""
    images = list(inputs.get("pixel_values", []))
    positions = list(inputs.get("image_position_ids", []))
    none = [None] * len(images)

    def ordered(image_side: list, video_side: list) -> list:
        return [*video_side, *image_side] if video_first else [*image_side, *video_side]

    return {"pixel_values": [ordered(images, [None])], "pixel_position_ids": [ordered(positions, [None])],
            "pixel_values_videos": [ordered(none, [inputs["pixel_values_videos"]])],
            "pixel_position_ids_videos": [ordered(none, [inputs["video_position_ids"]])]}


def hf_video_logits(hf, inputs: dict, both_ways: bool = True) -> torch.Tensor:
    """HF's logits at every prompt position. transformers 5.20's forward calls
    ``get_video_features`` without the frame counts it requires, so its encoders run here (with
    them) and the forward takes their outputs; ``both_ways`` off drops ``mm_token_type_ids``."""
    model = hf.model
    with torch.no_grad():
        encoded = {"video": model.get_video_features(inputs["pixel_values_videos"], inputs["video_position_ids"],
                                                     num_frames_per_video=inputs["num_frames_per_video"],
                                                     return_dict=True)}
        if "pixel_values" in inputs:
            encoded["image"] = model.get_image_features(inputs["pixel_values"], inputs["image_position_ids"],
                                                        return_dict=True)
        types = {"mm_token_type_ids": inputs["mm_token_type_ids"]} if both_ways else {}
        return hf(input_ids=inputs["input_ids"], mm_encoder_outputs=encoded, **types).logits[0]


def test_video_frames_match_transformers(variant, model, hf, processor):
    """Every position's logits of a one-video prompt and an image-plus-video prompt equal HF's:
    each frame its own run of video tokens through the tower, attended both ways like an image (HF's causal reading is far off there). The two-item prompt prefilled in
    two chunks cut between image and video; a prefix-cache start past the video (vLLM sends no
    frames for it); a start past a covered video with an image after it to compute counts the
    video's frame runs by its placeholder range (``mm_positions``), and is refused without it.
    Gemma 4 Unified's frames go through its
    embedder, each seen whole on every layer as its images are."""
    video = hf.config.video_token_id
    for images in (0, 1):
        inputs = video_request(processor, 3 + images, images)
        ids, expected = prompt_of(inputs), hf_video_logits(hf, inputs)
        assert len(vl_runs(ids, video)) == FRAMES
        got = prompt_logits_with(model, inputs, per_item(inputs))
        assert_every_position_matches(got, expected)
        if model.config.images_both_ways:
            at_frames = torch.tensor(ids) == video
            causal = hf_video_logits(hf, inputs, both_ways=False)
            assert (causal - expected)[at_frames].abs().max() > 100 * (got - expected).abs().max()
    d = driver(model)
    d.add(0, ids)
    d.prefill([(0, ids.index(hf.config.eoi_token_id) + 1)], **per_item(inputs))  # past the image, before the video
    torch.testing.assert_close(d.prefill([(0, len(ids))], **per_item(inputs))[0, -1], expected[-1], atol=1e-4,
                               rtol=1e-4)
    long = video_request(processor, 6, question=" ".join(["what is it?"] * 6))
    ids, expected = prompt_of(long), hf_video_logits(hf, long)[-1]
    past_video = -(-vl_runs(ids, video)[-1][1] // BLOCK)
    d.add(1, ids)
    d.prefill([(1, len(ids))], **per_item(long))
    d.add(2, ids, prefix_of=1, cached_blocks=past_video)
    got = d.prefill([(2, len(ids))], pixel_values_videos=[[None]], pixel_position_ids_videos=[[None]])[0, -1]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    first = video_request(processor, 7, 1, video_first=True)
    ids, expected = prompt_of(first), hf_video_logits(hf, first)[-1]
    runs = vl_runs(ids, video)
    boi = ids.index(hf.config.boi_token_id, runs[-1][1])  # the image's, after the frames
    positions = [[(runs[0][0] - 4, runs[-1][1] + 5 - runs[0][0]), (boi, ids.index(hf.config.eoi_token_id, boi) + 1 - boi)]]
    kwargs = per_item(first, video_first=True)
    d = driver(model)
    d.add(0, ids)
    d.prefill([(0, len(ids))], **kwargs)
    d.add(1, ids, prefix_of=0, cached_blocks=-(-runs[-1][1] // BLOCK))  # past the video: vLLM drops its data
    covered = {**kwargs, "pixel_values_videos": [[None, None]], "pixel_position_ids_videos": [[None, None]]}
    with pytest.raises(HostModelInputError, match="how many frames the covered items have is not sent"):
        d.prefill([(1, len(ids))], **covered)
    got = d.prefill([(1, len(ids))], **covered, mm_positions=positions)[0, -1]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    miscounted = [[(positions[0][0][0], runs[0][1] - runs[0][0] + 4), positions[0][1]]]  # the first frame only
    d.add(2, ids, prefix_of=0, cached_blocks=-(-runs[-1][1] // BLOCK))
    with pytest.raises(HostModelInputError, match="image placeholder runs"):
        d.prefill([(2, len(ids))], **covered, mm_positions=miscounted)


def vl_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """``[first, stop)`` of each run of ``token``."""
    return image_runs(torch.tensor(ids), token)


def prompt_logits_with(model, inputs: dict, kwargs: dict) -> torch.Tensor:
    """Every position's logits of the request's prompt, prefilled in one chunk with ``kwargs``."""
    d = driver(model)
    d.add(0, prompt_of(inputs))
    return d.prefill([(0, len(prompt_of(inputs)))], return_all_logits=True, **kwargs)[0]


def test_prefill_and_decode_match_transformers(model, hf, processor):
    """Three rows in one prefill (two images; one image; text only), then greedy decode steps
    side by side: every step's logits equal HF's full forward over the same tokens."""
    requests = {0: request(processor, [(32, 32), WIDE], 4), 1: request(processor, [(32, 32)], 5),
                2: request(processor, [], 6, "tell me a story")}
    d = driver(model)
    for slot, inputs in requests.items():
        d.add(slot, prompt_of(inputs))
    rows = [per_image(inputs) for inputs in requests.values()]
    d.prefill([(slot, len(prompt_of(inputs))) for slot, inputs in requests.items()],
              pixel_values=[r["pixel_values"][0] if r else None for r in rows],
              pixel_position_ids=[r["pixel_position_ids"][0] if r else None for r in rows])
    d.decode(5)
    for slot, inputs in requests.items():
        seq = d.seqs[slot]
        expected = hf_logits(hf, inputs, seq.history)[len(seq.prompt) - 1 : -1]
        torch.testing.assert_close(torch.stack(seq.logits), expected, atol=1e-4, rtol=1e-4, msg=f"slot {slot}")
    other = request(processor, [(32, 32)], 7)
    other["input_ids"] = requests[1]["input_ids"]
    assert (hf_logits(hf, other)[-1] - hf_logits(hf, requests[1])[-1]).abs().max() > 0.1  # the image matters


@pytest.mark.parametrize("sent", ["chunk images", "all images"])
def test_chunked_prefill_and_prefix_starts(variant, model, hf, processor, sent):
    """A two-image prompt prefilled in two chunks cut between the images (the runner may send
    the images of the chunk only, or all of them on every pass); a prefix-cache start inside the
    first image's run (its earlier tokens' KV already there, its vectors still needed); and a
    start past the first image (inside the second), whose pixels vLLM then does not send. Gemma 4
    Unified refuses the start inside the first image: its tokens see the whole image, further back
    than the sliding window keeps (it declares no prefix caching)."""
    inputs = request(processor, [(32, 32), WIDE], 8)
    ids, expected = prompt_of(inputs), hf_logits(hf, inputs)[-1]
    image = hf.config.image_token_id
    second = ids.index(image, ids.index(hf.config.eoi_token_id)) - 1  # the second image's begin marker
    pixels, positions = list(inputs["pixel_values"]), list(inputs["image_position_ids"])
    d = driver(model)
    d.add(0, ids)
    first = slice(0, 1) if sent == "chunk images" else slice(0, 2)
    d.prefill([(0, second)], pixel_values=[pixels[first]], pixel_position_ids=[positions[first]])
    later = slice(1, 2) if sent == "chunk images" else slice(0, 2)
    out = d.prefill([(0, len(ids))], pixel_values=[pixels[later]], pixel_position_ids=[positions[later]])
    torch.testing.assert_close(out[0, -1], expected, atol=1e-4, rtol=1e-4)
    first_stop = ids.index(hf.config.eoi_token_id)
    inside = first_stop // BLOCK  # cached blocks ending inside the first image's run...
    past_first = -(-first_stop // BLOCK)  # ...or past it, inside the second one's
    assert ids.index(image) < inside * BLOCK and past_first * BLOCK < ids.index(hf.config.eoi_token_id, second)
    for cached, sent_pixels in ((inside, pixels), (past_first, [None, pixels[1]])):
        d.add(1, ids, prefix_of=0, cached_blocks=cached)
        kwargs = {"pixel_values": [sent_pixels], "pixel_position_ids": [positions]}
        if variant == UNIFIED and cached == inside:  # the image reaches further back than the window kept
            with pytest.raises(HostModelInputError, match="must not start inside such an image"):
                d.prefill([(1, len(ids))], **kwargs)
            continue
        got = d.prefill([(1, len(ids))], **kwargs)[0, -1]
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"{cached} blocks cached")
    with pytest.raises(HostModelInputError, match=r"runs \[0\] are computed from position 0"):
        d.add(2, ids)
        d.prefill([(2, len(ids))], pixel_values=[[None, pixels[1]]], pixel_position_ids=[positions])


def test_bad_image_inputs_are_refused(variant, model, processor):
    inputs = request(processor, [(32, 32)], 9)
    ids = prompt_of(inputs)
    pixels, positions = list(inputs["pixel_values"]), list(inputs["image_position_ids"])
    quarter = 4 if variant == UNIFIED else 12  # a 4x4 corner of the merged grid, or of the patch grid
    beyond, out_of_range = (64, "reach past mm_posemb_size") if variant == UNIFIED else (1, "do not fill")
    cases = [
        ({"pixel_values": [None]}, "0 images, video frames and clips sent, but the tokens hold 1"),
        ({"pixel_values": [pixels * 2], "pixel_position_ids": [positions]}, "one per image"),
        ({"pixel_values": [pixels]}, "pixel_position_ids must come with pixel_values"),
        ({"pixel_values": [[(pixels[0] * 255).to(torch.uint8)]], "pixel_position_ids": [positions]}, "uint8"),
        ({"pixel_values": [pixels], "pixel_position_ids": [[positions[0][:10]]]}, "expected"),
        ({"pixel_values": [pixels], "pixel_position_ids": [[torch.where(positions[0] >= quarter, -1, positions[0])]]},
         "image item 0 makes 16 tokens, its placeholder run"),
        ({"pixel_values": [pixels], "pixel_position_ids": [[positions[0] + beyond]]}, out_of_range),
        ({"pixel_values": [pixels, pixels], "pixel_position_ids": [positions]}, "list of 1 rows"),
    ]
    for kwargs, message in cases:
        d = driver(model)
        d.add(0, ids)
        with pytest.raises(HostModelInputError, match=message):
            d.prefill([(0, len(ids))], **kwargs)
    d = driver(model)
    d.add(0, ids)
    with pytest.raises(HostModelInputError, match="chunk end cuts an image"):
        d.prefill([(0, ids.index(model.config.image_token_id) + 5)], pixel_values=[pixels],
                  pixel_position_ids=[positions])


def test_config_reading_and_refusals(variant, checkpoint):
    hf_config = AutoConfig.from_pretrained(checkpoint)
    reader = Gemma4UnifiedConfig if variant == UNIFIED else Gemma4VLConfig
    config = reader.read(hf_config)
    assert config.layer_windows == (32, None, 32, None) and config.layer_kv_sources == (0, 1, 0, 1)
    assert config.images_both_ways == (variant != "causal")
    assert config.pad_token_id == hf_config.text_config.pad_token_id
    assert config.placeholder_ids == (hf_config.image_token_id, hf_config.video_token_id, hf_config.audio_token_id)
    vision = config.vision
    if isinstance(vision, UnifiedVisionConfig):
        assert (vision.model_patch_size, vision.embed_dim, config.per_layer_input_size) == (12, 32, 0)
        refused = [("vision_config", "output_proj_dims", 16, TTConfigError)]
    else:
        assert (vision.pooling, vision.patch_size, vision.standardize, config.per_layer_input_size) == (3, 4, True, 8)
        refused = [("vision_config", "hidden_activation", "silu", TTUnsupportedFeatureError),
                   ("vision_config", "head_dim", 6, TTConfigError)]
    with pytest.raises(TTConfigError, match="text_config/vision_config"):
        reader.read(hf_config.text_config)
    for section, name, value, error in (
        *refused,
        ("text_config", "use_bidirectional_attention", "all", TTUnsupportedFeatureError),
        (None, "image_token_id", None, TTConfigError),
    ):
        broken = AutoConfig.from_pretrained(checkpoint)
        target = broken if section is None else getattr(broken, section)
        object.__setattr__(target, name, value)
        with pytest.raises(error, match=name):
            reader.read(broken)


@pytest.mark.parametrize(("arch", "cls"), [("TTGemma4ForConditionalGeneration", HostGemma4ForConditionalGeneration),
                                          ("TTGemma4UnifiedForConditionalGeneration",
                                           HostGemma4UnifiedForConditionalGeneration)])
def test_registered_for_the_host_backend(arch, cls):
    module, name = HOST_MODELS[arch].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is cls
    assert check_model_class(cls, owner="host").supports_sample_on_device
    assert cls.supports_multimodal
