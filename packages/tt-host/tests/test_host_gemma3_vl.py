"""The host Gemma 3 vision-language model against transformers' own modules and model.

A tiny random ``Gemma3ForConditionalGeneration`` (projector randomised: transformers starts it
at zeros, which would hide the image) is saved and loaded by both sides. The SigLIP tower, the
projector and the attention mask over image tokens are compared module by module (a tiny
end-to-end model would not show causal-vs-bidirectional image attention in greedy tokens);
then whole prompts with 0, 1 and 2 images run through the host contract (prefill with
``pixel_values``, chunked prefill, prefix-cache starts, decode) against HF's logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, Gemma3Config, Gemma3ForConditionalGeneration
from transformers.masking_utils import create_causal_mask
from transformers.models.gemma3.modeling_gemma3 import (
    create_masks_for_vision_model,
    get_block_sequence_ids_for_mask,
)
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models import HOST_MODELS
from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import image_runs
from vllm_tt_host.models.gemma3.vl import (
    Gemma3VLConfig,
    HostGemma3ForConditionalGeneration,
)
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh.shape import MeshShape

MM_TOKENS = 16
"""Image tokens per image: an 8x8 patch grid pooled 2x2; longer than the sliding window."""
WINDOW = 8
IMAGE, BOI, EOI = 299, 297, 298
BLOCK = 16
NUM_BLOCKS = 64


def tiny_config() -> Gemma3Config:
    return Gemma3Config(
        text_config=dict(
            vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, max_position_embeddings=512,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], query_pre_attn_scalar=16,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
            patch_size=4, vision_use_head=False,
        ),
        mm_tokens_per_image=MM_TOKENS, image_token_index=IMAGE, boi_token_index=BOI, eoi_token_index=EOI,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(tiny_config())
    with torch.no_grad():
        projector = hf.model.multi_modal_projector
        projector.mm_input_projection_weight.normal_(0, 0.3)
        projector.mm_soft_emb_norm.weight.normal_(0, 0.3)
        for weight in hf.model.language_model.parameters():
            if weight.dim() == 2:
                weight.mul_(4.0)  # sharper logits than the 0.02 init
    folder = tmp_path_factory.mktemp("tiny-gemma3-vl")
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf(checkpoint):
    return Gemma3ForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32,
                                                          attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def model(checkpoint):
    config = AutoConfig.from_pretrained(checkpoint)
    return HostGemma3ForConditionalGeneration.initialize_vllm_model(config, HostMeshDevice(MeshShape(1, 1)), 4, 512)


def images(seed: int, count: int) -> torch.Tensor:
    return torch.randn(count, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def prompt(seed: int, lengths: list[int]) -> list[int]:
    """Text runs of ``lengths`` with an image (``BOI``, placeholders, ``EOI``) between each two."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for k, n in enumerate(lengths):
        if k:
            ids += [BOI] + [IMAGE] * MM_TOKENS + [EOI]
        ids += torch.randint(3, 290, (n,), generator=gen).tolist()
    return ids


def hf_logits(hf, ids: list[int], pixels: torch.Tensor | None, bidirectional: bool = True) -> torch.Tensor:
    """HF's logits at every position; ``token_type_ids`` marks the image tokens (as the
    processor does) unless ``bidirectional`` is off."""
    input_ids = torch.tensor([ids])
    kwargs = {"token_type_ids": (input_ids == IMAGE).long()} if bidirectional and pixels is not None else {}
    with torch.no_grad():
        return hf(input_ids=input_ids, pixel_values=pixels, **kwargs).logits[0]


class Runner:
    """The TT runner reduced to one request per slot, legacy (shared) page table."""

    def __init__(self, model) -> None:
        cfg = model.config
        self.model = model
        self.kv = model.allocate_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, 3)
        self.table = torch.zeros(model.max_batch_size, 8, dtype=torch.int32)
        for slot in range(model.max_batch_size):
            self.table[slot] = torch.arange(1 + 8 * slot, 9 + 8 * slot)

    def prefill(self, rows: list[tuple[int, list[int], int, int]], pixel_values=None, **kwargs) -> torch.Tensor:
        """``(slot, ids, start, end)`` per row."""
        tokens = torch.zeros(len(rows), max(len(ids) for _, ids, _, _ in rows), dtype=torch.int32)
        for i, (_, ids, _, _) in enumerate(rows):
            tokens[i, : len(ids)] = torch.tensor(ids)
        return self.model.prefill_forward(
            tokens=tokens, page_table=self.table[[s for s, *_ in rows]], kv_cache=self.kv,
            prompt_lens=[end for *_, end in rows], start_pos=[start for _, _, start, _ in rows],
            empty_slots=[s for s, *_ in rows], pixel_values=pixel_values, **kwargs,
        )

    def decode(self, tokens: dict[int, tuple[int, int]]) -> torch.Tensor:
        """``{slot: (token, position)}``; returns ``[B, V]``."""
        rows = self.model.max_batch_size
        ids = torch.zeros(rows, 1, dtype=torch.int32)
        start = torch.full((rows,), -1, dtype=torch.int32)
        for slot, (token, pos) in tokens.items():
            ids[slot, 0], start[slot] = token, pos
        return self.model.decode_forward(tokens=ids, start_pos=start, page_table=self.table, kv_cache=self.kv)[:, -1]


# ---- modules ---------------------------------------------------------------------------------


def test_vision_tower_matches_siglip(model, hf):
    pixels = images(1, 3)
    with torch.no_grad():
        expected = hf.model.vision_tower(pixel_values=pixels).last_hidden_state
    got = model.decoder.tower(pixels)
    assert got.shape == (3, 64, 32)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)


def test_projector_matches_transformers(model, hf):
    states = torch.randn(2, 64, 32, generator=torch.Generator().manual_seed(2)) * 3
    with torch.no_grad():
        expected = hf.model.multi_modal_projector(states)
    got = model.decoder.projector(states)
    assert got.shape == (2, MM_TOKENS, 64)
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-5)
    assert expected.abs().mean() > 0.1  # the projector really projects (not transformers' zero init)


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_image_mask_matches_transformers(layer_type):
    """Our mask with image blocks equals transformers' for both layer kinds: image tokens see
    their own image's later tokens, the window still bounds the earlier keys, text stays
    causal, a later image cannot be seen early; without blocks it is plain causal."""
    config = tiny_config().text_config
    config._attn_implementation = "eager"  # a materialised mask (sdpa may skip a pure causal one)
    ids = torch.tensor([prompt(3, [5, 3, 4])])
    embeds = torch.zeros(1, ids.shape[1], 8)
    blocks = get_block_sequence_ids_for_mask((ids == IMAGE).long())
    position_ids = torch.arange(ids.shape[1])[None]
    expected = create_masks_for_vision_model(
        config=config, inputs_embeds=embeds, attention_mask=None, past_key_values=None,
        position_ids=position_ids, block_sequence_ids=blocks,
    )[layer_type]
    positions = torch.arange(ids.shape[1])[None]
    window = WINDOW if layer_type == "sliding_attention" else None
    ours = paged_kv.visible(positions, positions, window, blocks[0])
    torch.testing.assert_close(ours, _boolean(expected))
    causal = paged_kv.visible(positions, positions, window)
    assert (ours & ~causal).sum() > 2 * MM_TOKENS  # bidirectional pairs exist, so the test can fail
    if window is None:
        plain = create_causal_mask(config=config, inputs_embeds=embeds, attention_mask=None, past_key_values=None,
                                   position_ids=position_ids)
        torch.testing.assert_close(causal, _boolean(plain))


def _boolean(mask: torch.Tensor) -> torch.Tensor:
    """transformers' mask (bool, or float with -inf) as ``[1, q, k]`` booleans."""
    mask = mask[:, 0]
    return mask if mask.dtype == torch.bool else mask == 0


def test_image_positions_attend_both_ways(model, hf):
    """All-position logits of a two-image prompt equal HF's with ``token_type_ids``; HF's
    causal reading of the same prompt is far off at the image positions."""
    ids, pixels = prompt(4, [6, 5, 7]), images(5, 2)
    got = Runner(model).prefill([(0, ids, 0, len(ids))], [[pixels[:1], pixels[1:]]], return_all_logits=True)[0]
    expected = hf_logits(hf, ids, pixels)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    causal = hf_logits(hf, ids, pixels, bidirectional=False)
    at_images = torch.tensor(ids) == IMAGE
    assert (causal - expected)[at_images].abs().max() > 100 * (got - expected).abs().max()


# ---- the whole model through the contract ----------------------------------------------------


def test_prefill_and_decode_match_transformers(model, hf):
    """Three rows in one prefill (two images; one image; text only), then greedy decode steps
    side by side: every step's logits equal HF's full forward over the same tokens."""
    pixels = images(6, 3)
    seqs = {0: (prompt(7, [4, 9, 3]), pixels[:2]), 1: (prompt(8, [20, 6]), pixels[2:]), 2: (prompt(9, [30]), None)}
    runner = Runner(model)
    out = runner.prefill(
        [(slot, ids, 0, len(ids)) for slot, (ids, _) in seqs.items()],
        [None if p is None else [p[i : i + 1] for i in range(p.shape[0])] for _, p in seqs.values()],
    )[:, -1]
    histories = {slot: list(ids) for slot, (ids, _) in seqs.items()}
    for step in range(6):
        for slot, (_, pix) in seqs.items():
            expected = hf_logits(hf, histories[slot], pix)[-1]
            torch.testing.assert_close(out[slot], expected, atol=1e-4, rtol=1e-4, msg=f"slot {slot} step {step}")
            histories[slot].append(int(expected.argmax()))
        out = runner.decode({slot: (h[-1], len(h) - 1) for slot, h in histories.items()})
    with_image = hf_logits(hf, seqs[1][0], seqs[1][1])[-1]
    other_image = hf_logits(hf, seqs[1][0], pixels[:1])[-1]
    assert (with_image - other_image).abs().max() > 0.1  # the image changes the next token's logits


@pytest.mark.parametrize("sent", ["chunk images", "all images"])
def test_chunked_prefill_and_prefix_start(model, hf, sent):
    """A two-image prompt prefilled in two chunks cut between the images (the runner may send
    the images of the chunk only, or all of the request's images on every pass), and a
    prefix-cache start inside the first image's run (its earlier tokens' KV already there, its
    features still needed)."""
    ids, pixels = prompt(10, [5, 8, 6]), images(11, 2)
    second = ids.index(IMAGE, 5 + MM_TOKENS + 2) - 1  # the second image's BOI
    expected = hf_logits(hf, ids, pixels)[-1]
    runner = Runner(model)
    both = [pixels[:1], pixels[1:]]
    runner.prefill([(0, ids, 0, second)], [[pixels[:1]] if sent == "chunk images" else both])
    later = [pixels[1:]] if sent == "chunk images" else both
    torch.testing.assert_close(runner.prefill([(0, ids, second, len(ids))], [later])[0, -1], expected,
                               atol=1e-4, rtol=1e-4)
    cached = 5 + 1 + MM_TOKENS // 2
    runner.prefill([(1, ids, 0, len(ids))], [[pixels[:1], pixels[1:]]])
    torch.testing.assert_close(runner.prefill([(1, ids, cached, len(ids))], [[pixels[:1], pixels[1:]]])[0, -1],
                               expected, atol=1e-4, rtol=1e-4)


def test_prefix_hit_past_an_image_without_its_pixels(model, hf):
    """vLLM sends no pixels for an image inside the prefix-cache hit (None in its place): the
    later image still maps to its own placeholder run, and the logits equal HF's."""
    ids, pixels = prompt(13, [5, 8, 6]), images(14, 2)
    expected = hf_logits(hf, ids, pixels)[-1]
    runner = Runner(model)
    runner.prefill([(0, ids, 0, len(ids))], [[pixels[:1], pixels[1:]]])
    cached = 5 + 1 + MM_TOKENS + 3  # past the first image, before the second
    got = runner.prefill([(0, ids, cached, len(ids))], [[None, pixels[1:]]])[0, -1]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    other = hf_logits(hf, ids, torch.cat([pixels[1:], pixels[:1]]))[-1]
    assert (other - expected).abs().max() > 0.1  # the wrong image would show
    with pytest.raises(HostModelInputError, match=r"runs \[1\] are computed from position 10"):
        runner.prefill([(0, ids, 10, len(ids))], [[pixels[:1], None]])


def test_pan_and_scan_crops_and_a_prefix_hit_past_them(model, hf):
    """An image with two pan-and-scan crops is one tensor ``[3, c, h, w]`` filling three
    placeholder runs. Served again from a prefix-cache hit past all of them, it comes as one
    None (its crop count unknown to the runner), and the logits still equal HF's."""
    ids, pixels = prompt(15, [5, 4, 4, 6]), images(16, 3)
    expected = hf_logits(hf, ids, pixels)[-1]
    runner = Runner(model)
    torch.testing.assert_close(runner.prefill([(0, ids, 0, len(ids))], [[pixels]])[0, -1], expected,
                               atol=1e-4, rtol=1e-4)
    past_crops = max(i for i, t in enumerate(ids) if t == IMAGE) + 2
    torch.testing.assert_close(runner.prefill([(0, ids, past_crops, len(ids))], [[None]])[0, -1], expected,
                               atol=1e-4, rtol=1e-4)


def test_bad_image_inputs_are_refused(model):
    ids = prompt(12, [4, 4])
    runner = Runner(model)
    with pytest.raises(HostModelInputError, match="0 image crops sent, but the tokens hold 1"):
        runner.prefill([(0, ids, 0, len(ids))], [None])
    two = prompt(12, [4, 4, 4])
    with pytest.raises(HostModelInputError, match="1 image crops sent, but the tokens hold 2"):
        runner.prefill([(0, two, 0, len(two))], [[images(0, 1)]])
    with pytest.raises(HostModelInputError, match="uint8"):
        runner.prefill([(0, ids, 0, len(ids))], [[torch.zeros(1, 3, 32, 32, dtype=torch.uint8)]])
    with pytest.raises(HostModelInputError, match="chunk end cuts an image"):
        runner.prefill([(0, ids, 0, 10)], [[images(0, 1)]])
    with pytest.raises(HostModelInputError, match="list of 1 rows"):
        runner.prefill([(0, ids, 0, len(ids))], [None, None])
    with pytest.raises(ValueError, match="vision tower takes"):
        runner.prefill([(0, ids, 0, len(ids))], [[torch.zeros(1, 3, 16, 16)]])


def test_image_runs():
    assert image_runs(torch.tensor([1, 9, 9, 2, 9, 3, 9]), 9) == [(1, 3), (4, 5), (6, 7)]
    assert image_runs(torch.tensor([1, 2]), 9) == []


def test_config_reading_and_refusals():
    config = Gemma3VLConfig.read(tiny_config())
    assert (config.mm_tokens_per_image, config.image_token_id, config.tokens_per_side) == (MM_TOKENS, IMAGE, 4)
    assert config.vision is not None and config.vision.patches_per_side == 8
    assert config.layer_windows == (WINDOW, WINDOW, None)
    bad = tiny_config()
    bad.mm_tokens_per_image = 15
    with pytest.raises(TTConfigError, match="mm_tokens_per_image"):
        Gemma3VLConfig.read(bad)
    with pytest.raises(TTConfigError, match="text_config/vision_config"):
        Gemma3VLConfig.read(tiny_config().text_config)


def test_registered_for_the_host_backend():
    module, name = HOST_MODELS["TTGemma3ForConditionalGeneration"].split(":")
    assert getattr(__import__(module, fromlist=[name]), name) is HostGemma3ForConditionalGeneration
    assert check_model_class(HostGemma3ForConditionalGeneration, owner="host").supports_sample_on_device
