"""The host Mistral 3 model against transformers' own modules and model.

A tiny random ``Mistral3ForConditionalGeneration`` (untied lm_head, projector with biases) is
saved with a word-level tokenizer holding ``[IMG]``, ``[IMG_BREAK]`` and ``[IMG_END]``, and
loaded by both sides. The Pixtral tower (2D rotary over a non-square patch grid) and the
projector (patch merger) are compared module by module; then prompts with 0, 1 and 2 images of
different sizes run through the host contract (``ContractDriver``: paged KV, one prefill step
of several rows, chunks ending between images, a prefix-cache start past an image sent as None,
decode) and every computed position's logits equal HF's."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, Mistral3Config, Mistral3ForConditionalGeneration
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.mistral3.model import HostMistral3ForConditionalGeneration
from vllm_tt_host.models.mistral3.model import Mistral3Config as HostMistral3Config
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.errors import TTUnsupportedFeatureError
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.contract_driver import ContractDriver

IMAGE, BREAK, END = 10, 11, 12
PATCH, MERGE = 4, 2
SIZES = ((16, 24), (32, 16))
"""(h, w) pixels of the test images: 2x3 and 4x2 image tokens (4x6 and 8x4 patches)."""
BLOCK = 8
NUM_BLOCKS = 96
WIDTH = 16


def tiny_config() -> Mistral3Config:
    return Mistral3Config(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         sliding_window=None, rms_norm_eps=1e-5),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=64, patch_size=PATCH, head_dim=8, hidden_act="silu"),
        image_token_index=IMAGE, spatial_merge_size=MERGE, multimodal_projector_bias=True, tie_word_embeddings=False,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer, models

    torch.manual_seed(0)
    hf = Mistral3ForConditionalGeneration(tiny_config())
    with torch.no_grad():
        for name, weight in hf.named_parameters():
            if weight.dim() == 2:
                weight.mul_(4.0 if "language_model" in name else 8.0)  # sharper than the 0.02 init
            elif name.endswith("bias"):
                weight.normal_(0, 0.3)
    folder = tmp_path_factory.mktemp("tiny-mistral3")
    hf.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(300)} | {"[IMG]": IMAGE, "[IMG_BREAK]": BREAK, "[IMG_END]": END}
    Tokenizer(models.WordLevel({k: v for k, v in vocab.items() if v not in (IMAGE, BREAK, END) or "[" in k},
                               unk_token="t0")).save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def hf(checkpoint):
    return Mistral3ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(checkpoint):
    config = AutoConfig.from_pretrained(checkpoint)
    return HostMistral3ForConditionalGeneration.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), 4,
                                                                       WIDTH * BLOCK)


def driver(model) -> ContractDriver:
    cfg = model.config
    kv = model.allocate_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)
    return ContractDriver(model, kv, width=WIDTH)


def image(seed: int, size: tuple[int, int]) -> torch.Tensor:
    """Normalised pixels ``[3, h, w]`` as vLLM sends one image."""
    return torch.randn(3, *size, generator=torch.Generator().manual_seed(seed))


def placeholders(size: tuple[int, int]) -> list[int]:
    rows, cols = size[0] // (PATCH * MERGE), size[1] // (PATCH * MERGE)
    return ([IMAGE] * cols + [BREAK]) * (rows - 1) + [IMAGE] * cols + [END]


def prompt(seed: int, lengths: list[int]) -> list[int]:
    """Text runs of ``lengths`` with image ``k`` (``SIZES[k]``) after run ``k``."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for k, n in enumerate(lengths):
        if k:
            ids += placeholders(SIZES[k - 1])
        ids += torch.randint(20, 300, (n,), generator=gen).tolist()
    return ids


def hf_logits(hf, ids: list[int], pictures: list[torch.Tensor]) -> torch.Tensor:
    """HF's logits at every position; the images padded into one batch with their ``image_sizes``,
    as the HF processor sends them."""
    kwargs = {}
    if pictures:
        height, width = max(p.shape[1] for p in pictures), max(p.shape[2] for p in pictures)
        kwargs = {"pixel_values": torch.stack([torch.nn.functional.pad(p, (0, width - p.shape[2], 0,
                                                                           height - p.shape[1])) for p in pictures]),
                  "image_sizes": torch.tensor([list(p.shape[1:]) for p in pictures])}
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), **kwargs).logits[0]


def close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# ---- modules ---------------------------------------------------------------------------------


def test_pixtral_tower_matches_transformers_on_a_non_square_image(model, hf):
    pixels = image(1, SIZES[0])
    with torch.no_grad():
        expected = hf.model.vision_tower(pixels[None], image_sizes=[SIZES[0]]).last_hidden_state[0]
    got = model.decoder.tower(pixels)
    assert got.shape == (4 * 6, 32)
    close(got, expected)
    transposed = model.decoder.tower(pixels.transpose(1, 2).contiguous())  # rows and columns rotate apart
    assert transposed.shape == got.shape and (transposed - got).abs().max() > 0.1


def test_image_features_match_transformers(model, hf):
    """Tower, norm, patch merger and projector of two images of different sizes, padded by HF."""
    pictures = [image(2, SIZES[0]), image(3, SIZES[1])]
    padded = torch.zeros(2, 3, 32, 24)
    for k, p in enumerate(pictures):
        padded[k, :, : p.shape[1], : p.shape[2]] = p
    with torch.no_grad():
        expected = hf.model.get_image_features(pixel_values=padded, image_sizes=torch.tensor(SIZES)).pooler_output
    for k, p in enumerate(pictures):
        got = model.decoder.image_features(p)
        assert got.shape == (len(placeholders(SIZES[k])) - SIZES[k][0] // 8, 64)
        close(got, expected[k])


# ---- the whole model through the contract ----------------------------------------------------


def test_every_position_matches_with_0_1_and_2_images_in_one_prefill(model, hf):
    """Three rows in one prefill step (text only; one image; two images), every position's
    logits, then greedy decode steps: each step's logits equal HF's over the same tokens."""
    d = driver(model)
    pictures = [image(4, SIZES[0]), image(5, SIZES[0]), image(6, SIZES[1])]
    seqs = {0: (prompt(7, [20]), []), 1: (prompt(8, [5, 9]), pictures[:1]), 2: (prompt(9, [4, 6, 3]), pictures[1:])}
    for slot, (ids, _) in seqs.items():
        d.add(slot, ids)
    out = d.prefill([(slot, len(ids)) for slot, (ids, _) in seqs.items()], return_all_logits=True,
                    pixel_values=[p or None for _, p in seqs.values()])
    for slot, (ids, pics) in seqs.items():
        close(out[slot, -len(ids):], hf_logits(hf, ids, pics))
    for slot in seqs:
        d.seqs[slot].generated.append(int(out[slot, -1].argmax()))
    d.decode(4)
    for slot, (ids, pics) in seqs.items():
        history = d.seqs[slot].history
        expected = hf_logits(hf, history[:-1], pics)[len(ids):]
        close(torch.stack(d.seqs[slot].logits), expected)


def test_chunked_prefill_between_images(model, hf):
    """A two-image prompt in three chunks ending before, between and after the images; the
    runner sends all the request's images on each pass. A chunk end inside an image is refused."""
    ids, pictures = prompt(10, [5, 4, 6]), [image(11, SIZES[0]), image(12, SIZES[1])]
    second = 5 + len(placeholders(SIZES[0])) + 2
    expected = hf_logits(hf, ids, pictures)
    d = driver(model)
    d.add(0, ids)
    start = 0
    for end in (3, second, len(ids)):
        got = d.prefill([(0, end)], return_all_logits=True, pixel_values=[pictures])[0, -(end - start):]
        close(got, expected[start:end])
        start = end
    d.add(1, ids)
    with pytest.raises(HostModelInputError, match="chunk end cuts an image"):
        d.prefill([(1, 5 + 3)], pixel_values=[pictures])


def test_prefix_start_past_an_image_sent_as_none(model, hf):
    """A prefix-cache hit of two blocks ends past the first image (vLLM sends it as None) and
    before the second: the second image still fills its own placeholders. A hit ending inside
    the second image needs its pixels (the pass computes part of it), and gets them."""
    ids, pictures = prompt(13, [3, 7, 6]), [image(14, SIZES[0]), image(15, SIZES[1])]
    assert 3 + len(placeholders(SIZES[0])) <= 2 * BLOCK < 3 + 7 + len(placeholders(SIZES[0]))
    expected = hf_logits(hf, ids, pictures)
    d = driver(model)
    d.add(0, ids)
    d.prefill([(0, len(ids))], pixel_values=[pictures])
    d.add(1, ids, prefix_of=0, cached_blocks=2)
    got = d.prefill([(1, len(ids))], return_all_logits=True, pixel_values=[[None, pictures[1]]])[0]
    close(got[-(len(ids) - 2 * BLOCK):], expected[2 * BLOCK:])
    d.add(2, ids, prefix_of=0, cached_blocks=3)  # 24: inside the second image (18..30)
    got = d.prefill([(2, len(ids))], return_all_logits=True, pixel_values=[[None, pictures[1]]])[0]
    close(got[-(len(ids) - 3 * BLOCK):], expected[3 * BLOCK:])
    other = hf_logits(hf, ids, [pictures[0], image(16, SIZES[1])])
    assert (other - expected)[-1].abs().max() > 0.1  # the wrong image would show
    d.add(3, ids, prefix_of=0, cached_blocks=1)
    with pytest.raises(HostModelInputError, match=r"runs \[0\] are computed from position 8"):
        d.prefill([(3, len(ids))], pixel_values=[[None, pictures[1]]])


def test_bad_image_inputs_are_refused(model):
    ids = prompt(17, [4, 4])
    d = driver(model)
    d.add(0, ids)
    with pytest.raises(HostModelInputError, match="0 images sent, but the tokens hold 1"):
        d.prefill([(0, len(ids))], pixel_values=[None])
    with pytest.raises(HostModelInputError, match="makes 8 image tokens, its placeholders at 4..12 hold 6"):
        d.prefill([(0, len(ids))], pixel_values=[[image(0, SIZES[1])]])
    with pytest.raises(HostModelInputError, match="multiples of 8"):
        d.prefill([(0, len(ids))], pixel_values=[[image(0, (16, 20))]])
    with pytest.raises(HostModelInputError, match="list of 1 rows"):
        d.prefill([(0, len(ids))], pixel_values=[None, None])


def test_uint8_pixels_are_normalised_as_the_hf_image_processor_does(model, hf):
    """vLLM's default for Mistral 3 sends uint8 pixels (it normalises on the device): the host
    model's logits with them equal HF's with the image processor's floats."""
    from transformers import PixtralImageProcessor

    raw = torch.randint(0, 256, (3, *SIZES[0]), dtype=torch.uint8, generator=torch.Generator().manual_seed(20))
    floats = PixtralImageProcessor(patch_size={"height": 8, "width": 8})(raw.permute(1, 2, 0).numpy(),
                                                                         return_tensors="pt")["pixel_values"][0]
    assert floats.shape == (3, *SIZES[0])
    ids = prompt(21, [4, 5])
    d = driver(model)
    d.add(0, ids)
    got = d.prefill([(0, len(ids))], return_all_logits=True, pixel_values=[[raw]])[0]
    close(got[-len(ids):], hf_logits(hf, ids, [floats]))


def test_image_sizes_crop_padded_pixels(model, hf):
    """A caller sending HF-style padded pixels ``[1, 3, H, W]`` with ``image_sizes`` gets the same."""
    ids, picture = prompt(18, [4, 5]), image(19, SIZES[0])
    padded = torch.nn.functional.pad(picture, (0, 8, 0, 16))[None]
    d = driver(model)
    d.add(0, ids)
    got = d.prefill([(0, len(ids))], pixel_values=[[padded]], image_sizes=[[torch.tensor(SIZES[0])]])[0, -1]
    close(got, hf_logits(hf, ids, [picture])[-1])


def test_config_reading_and_refusals():
    config = HostMistral3Config.read(tiny_config())
    assert (config.image_token_id, config.merged_patch, config.feature_layer) == (IMAGE, 8, 2)
    assert (config.family, config.tie_word_embeddings, config.projector_bias) == ("mistral", False, True)
    assert config.vision.head_dim == 8 and config.vision.activation == "silu"
    listed = tiny_config()
    listed.vision_feature_layer = [-1, -2]
    with pytest.raises(TTUnsupportedFeatureError, match="vision_feature_layer"):
        HostMistral3Config.read(listed)


def test_registered_for_the_host_backend_and_takes_vllms_processor():
    module, name = HOST_MODELS["TTMistral3ForConditionalGeneration"].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is HostMistral3ForConditionalGeneration
    caps = check_model_class(HostMistral3ForConditionalGeneration, owner="test")
    assert caps.supports_prefix_caching and caps.supports_sample_on_device
    assert HostMistral3ForConditionalGeneration.supports_multimodal is True
    # vLLM's own answer: no placeholder text, the checkpoint's chat template writes [IMG] itself.
    assert HostMistral3ForConditionalGeneration.get_placeholder_str("image", 1) is None
