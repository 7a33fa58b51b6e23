"""The host Gemma 4 audio tower and audio prompts (``TTGemma4ForConditionalGeneration`` with an
``audio_config``, as the E-series checkpoints have) against transformers' own
``Gemma4ForConditionalGeneration``, and Gemma 4 Unified's encoder-free audio embedder (raw
sample frames, one token each) against ``Gemma4UnifiedForConditionalGeneration``.

A tiny random model (the recipe's processor and vision-language config plus ``AUDIO_CONFIG``: the
feature extractor's 128 mel bins, two conformer layers attending 4 frames back in blocks of 4
queries) is saved and loaded by both sides. The tower is compared clip by clip (its subsampled
frames, the padding of a shorter clip in one batch stripped); then prompts with a clip, and with
an image and a clip, run through the hybrid-KV contract (``input_features_padded`` and
``input_features_mask`` as vLLM's processor sends them) against HF's logits at every position,
in one chunk and in two cut between the image and the clip."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoConfig, Gemma4ForConditionalGeneration, Gemma4UnifiedForConditionalGeneration
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.gemma4.audio import Gemma4AudioConfig
from vllm_tt_host.models.gemma4.embedder import UnifiedAudioConfig
from vllm_tt_host.models.gemma4.unified import Gemma4UnifiedConfig, HostGemma4UnifiedForConditionalGeneration
from vllm_tt_host.models.gemma4.vl import Gemma4VLConfig, HostGemma4ForConditionalGeneration
from vllm_tt_host.tiny import corpus_text
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.contract_driver import ContractDriver
from vllm_tt_testing.parity import assert_every_position_matches
from vllm_tt_testing.tiny_gemma4_vl import build_processor, random_gemma4
from vllm_tt_testing.tiny_vl import synthetic_image, user_message

BLOCK = 16
NUM_BLOCKS = 96
WIDTH = 24
RATE = 16000


UNIFIED = "unified"
HF_CLASSES = {"gemma4": Gemma4ForConditionalGeneration, UNIFIED: Gemma4UnifiedForConditionalGeneration}
HOST_CLASSES = {"gemma4": HostGemma4ForConditionalGeneration, UNIFIED: HostGemma4UnifiedForConditionalGeneration}
"""Gemma 4 with its audio tower, and Gemma 4 Unified with its encoder-free audio embedder."""


@pytest.fixture(scope="module", params=list(HF_CLASSES))
def variant(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def processor(variant):
    paragraphs = [p.strip() for p in corpus_text().split("\n\n") if p.strip()]
    return build_processor(paragraphs, unified=variant == UNIFIED)


@pytest.fixture(scope="module")
def checkpoint(variant, processor, tmp_path_factory):
    hf = random_gemma4(processor, unified=variant == UNIFIED, audio=True)
    folder = tmp_path_factory.mktemp("tiny-gemma4-audio")
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf(variant, checkpoint):
    return HF_CLASSES[variant].from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model(variant, checkpoint):
    return HOST_CLASSES[variant].initialize_vllm_model(
        AutoConfig.from_pretrained(checkpoint), HostMeshDevice(MeshShape(1, 1)), 4, WIDTH * BLOCK)


def clip(seed: int, seconds: float = 0.4) -> np.ndarray:
    """A float32 waveform at 16 kHz: two tones of the seed's pitches."""
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * (200 + 97 * seed) * t) + 0.2 * np.sin(2 * np.pi * (1100 + 53 * seed) * t)
            ).astype(np.float32)


def request(processor, seed: int, image: bool = False, seconds: float = 0.4) -> dict:
    """The processor's inputs for a chat prompt with an image (optional) and then a clip."""
    question = "what is it?"
    text = processor.apply_chat_template(user_message(int(image), question), add_generation_prompt=True,
                                         tokenize=False).replace(question, processor.audio_token + question, 1)
    pictures = [[Image.fromarray(synthetic_image(seed, 7 * seed, (32, 32)))]] if image else None
    return dict(processor(text=[text], images=pictures, audio=[clip(seed, seconds)], return_tensors="pt",
                          add_special_tokens=False))


def per_item(inputs: dict) -> dict:
    """The runner's kwargs of the row: its image (if any), then its clip, as vLLM's processor sends
    them (the clip's frames without the batch padding)."""
    real = inputs["input_features_mask"][0].bool()
    clip_entry = inputs["input_features"][0][real]
    images = list(inputs.get("pixel_values", []))
    none = [None] * len(images)
    return {"pixel_values": [[*images, None]], "pixel_position_ids": [[*inputs.get("image_position_ids", []), None]],
            "input_features_padded": [[*none, clip_entry]], "input_features_mask": [[*none, real[real]]]}


def driver(model) -> ContractDriver:
    return ContractDriver.per_layer(model, NUM_BLOCKS, BLOCK, width=WIDTH, spoil="nan")


def hf_logits(hf, inputs: dict) -> torch.Tensor:
    kwargs = {k: inputs[k] for k in ("pixel_values", "image_position_ids", "input_features", "input_features_mask",
                                     "mm_token_type_ids") if k in inputs}
    with torch.no_grad():
        return hf(input_ids=inputs["input_ids"], **kwargs).logits[0]


def test_audio_tower_matches_transformers(model, hf, processor):
    """Two clips in one batch (0.4 s and 0.25 s: the shorter padded), each through the tower
    (Unified: the embedder): the real frames' vectors equal HF's, and the token count is the
    processor's."""
    waves = [clip(1), clip(2, 0.25)]
    batch = processor.feature_extractor(waves, sampling_rate=RATE, return_tensors="pt")
    features, mask = batch["input_features"], batch["input_features_mask"]
    with torch.no_grad():
        out = hf.model.get_audio_features(features, mask.bool(), return_dict=True)
    for k in range(2):
        want = out.pooler_output[k][out.attention_mask[k]]
        real = mask[k].bool()
        got = model.decoder.audio(features[k][real], real[real])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        assert got.shape[0] == model.decoder.audio.tokens(int(real.sum()))
    assert want.abs().mean() > 0.5
    ids = request(processor, 1)["input_ids"][0]
    assert int((ids == hf.config.audio_token_id).sum()) == model.decoder.audio.tokens(int(mask[0].sum()))


@pytest.mark.parametrize("image", [False, True], ids=["clip", "image-and-clip"])
def test_every_position_matches_transformers(model, hf, processor, image):
    """Every position's logits of a prompt with a clip (after an image) equal HF's (1e-4), in one
    chunk and in two cut between the image and the clip; the clip decides the logits."""
    inputs = request(processor, 3, image)
    ids, expected = inputs["input_ids"][0].tolist(), hf_logits(hf, inputs)
    d = driver(model)
    d.add(0, ids)
    got = d.prefill([(0, len(ids))], return_all_logits=True, **per_item(inputs))[0]
    assert_every_position_matches(got, expected)
    if image:
        d.add(1, ids)
        d.prefill([(1, ids.index(hf.config.eoi_token_id) + 1)], **per_item(inputs))
        out = d.prefill([(1, len(ids))], **per_item(inputs))[0, -1]
        torch.testing.assert_close(out, expected[-1], atol=1e-4, rtol=1e-4)
    other = request(processor, 5, image)
    assert (hf_logits(hf, other)[-1] - expected[-1]).abs().max() > 0.1  # another clip, other logits


def test_audio_inputs_are_refused_when_wrong(model, processor):
    inputs = request(processor, 4)
    ids = inputs["input_ids"][0].tolist()
    kwargs = per_item(inputs)
    features = kwargs["input_features_padded"][0][0]
    for changed, message in (
        ({"input_features_padded": [[features[:, :64]]]}, rf"\[frames, {features.shape[1]}\]"),
        ({"input_features_padded": [[features[:-8]]], "input_features_mask": [[None]]}, "makes"),
        ({"input_features_mask": [[torch.ones(3, dtype=torch.bool)]]}, "expected"),
    ):
        d = driver(model)
        d.add(0, ids)
        with pytest.raises(HostModelInputError, match=message):
            d.prefill([(0, len(ids))], **{**kwargs, **changed})


def test_config_reads_the_audio_tower(variant, checkpoint):
    config = (Gemma4UnifiedConfig if variant == UNIFIED else Gemma4VLConfig).read(AutoConfig.from_pretrained(checkpoint))
    audio = config.audio
    if variant == UNIFIED:
        assert isinstance(audio, UnifiedAudioConfig) and audio.embed_dim == 640
        return
    assert isinstance(audio, Gemma4AudioConfig)
    assert (audio.channels, audio.chunk, audio.past, audio.future) == ((128, 8), 4, 4, 0)
    assert (audio.hidden_size, audio.num_heads, audio.output_dims, audio.clipped) == (32, 2, 24, True)
