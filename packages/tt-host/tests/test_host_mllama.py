"""The host Mllama (Llama 3.2 Vision) model against transformers' own model.

A tiny random ``MllamaForConditionalGeneration`` (2 tiles per image, 2 of its 4 text layers
cross-attention layers, every ``tanh`` gate drawn away from 0 so that each gated path counts)
is saved and loaded by both sides. The tiled vision tower and projector are compared alone;
then prompts without images, with one image and with two (one before any text, one after some,
one image using only one of its two tiles) run through the host contract (``ContractDriver``:
paged text KV, the vision K/V in cross-attention blocks of their own taken from the same pool
and passed as ``cross_page_table``, one prefill step of several rows, a fixed decode batch with
a padding row), and every position's logits equal HF's (HF's ``cross_attention_mask`` built by
its processor's own functions, extended over generated tokens as ``generate`` extends it)."""

from __future__ import annotations

import math
import re

import pytest
import torch
from transformers import AutoConfig, MllamaConfig, MllamaForConditionalGeneration
from transformers.models.mllama.processing_mllama import (
    convert_sparse_cross_attention_mask_to_dense,
    get_cross_attention_token_mask,
)
from vllm_tt_host.device import HostMeshDevice
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.mllama.model import HostMllamaForConditionalGeneration
from vllm_tt_models_registry.contract import check_model_class
from vllm_tt_platform.mesh.shape import MeshShape
from vllm_tt_testing.contract_driver import ContractDriver

IMAGE = 290
TILES, SIZE, PATCH = 2, 16, 4
KEYS_PER_IMAGE = TILES * ((SIZE // PATCH) ** 2 + 1)
BLOCK = 8
NUM_BLOCKS = 96
WIDTH = 16
STEPS = 3


def tiny_config(**vision: object) -> MllamaConfig:
    return MllamaConfig(
        text_config=dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, cross_attention_layers=[1, 3],
                         max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
                         pad_token_id=0),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_global_layers=2,
                           attention_heads=4, image_size=SIZE, patch_size=PATCH, max_num_tiles=TILES,
                           supported_aspect_ratios=[[1, 1], [1, 2], [2, 1]], intermediate_layers_indices=[2, 0],
                           vision_output_dim=96) | vision,
        image_token_index=IMAGE,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    hf = MllamaForConditionalGeneration(tiny_config())
    with torch.no_grad():
        for name, weight in hf.named_parameters():
            if name.rsplit(".", 1)[-1] in ("gate", "gate_attn", "gate_ffn", "cross_attn_attn_gate",
                                           "cross_attn_mlp_gate"):
                weight.uniform_(0.5, 1.5)  # the zero init would switch every gated path off
            elif weight.dim() >= 2:
                weight.mul_(4.0)  # sharper than the 0.02 init
            elif name.endswith("bias"):
                weight.normal_(0, 0.3)
    folder = tmp_path_factory.mktemp("tiny-mllama")
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def hf(checkpoint):
    return MllamaForConditionalGeneration.from_pretrained(checkpoint, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def model(checkpoint):
    return HostMllamaForConditionalGeneration.initialize_vllm_model(
        AutoConfig.from_pretrained(checkpoint), HostMeshDevice(MeshShape(1, 1)), 4, WIDTH * BLOCK)


def driver(model) -> ContractDriver:
    cfg = model.config
    kv = model.allocate_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32, cfg.num_layers)
    return ContractDriver(model, kv, width=WIDTH)


def images(seed: int, tiles: list[int]) -> dict[str, torch.Tensor]:
    """Normalised tiles for images using ``tiles[k]`` of their 2 tiles (the rest zero, as the
    processor pads them), with an aspect ratio id that fits."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn(len(tiles), TILES, 3, SIZE, SIZE, generator=gen)
    mask = torch.zeros(len(tiles), TILES, dtype=torch.long)
    for k, used in enumerate(tiles):
        pixels[k, used:] = 0
        mask[k, :used] = 1
    return {"pixel_values": pixels, "aspect_ratio_ids": torch.tensor([1 if t == 1 else 2 + k % 2
                                                                      for k, t in enumerate(tiles)]),
            "aspect_ratio_mask": mask}


def prompt(seed: int, lengths: list[int]) -> list[int]:
    """Text runs of ``lengths`` with an ``<|image|>`` before run ``k`` for ``k >= 1``."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for k, n in enumerate(lengths):
        ids += [IMAGE] * (k > 0) + torch.randint(3, 280, (n,), generator=gen).tolist()
    return ids


def hf_logits(hf, ids: list[int], prompt_len: int, pictures: dict[str, torch.Tensor] | None) -> torch.Tensor:
    """HF's logits at every position of ``ids`` (a prompt of ``prompt_len`` plus generated tokens)."""
    if pictures is None:
        kwargs = {}
    else:
        tiles = pictures["aspect_ratio_mask"].sum(-1).tolist()
        sparse = get_cross_attention_token_mask(ids[:prompt_len], IMAGE)
        dense = torch.as_tensor(convert_sparse_cross_attention_mask_to_dense([sparse], [tiles], TILES, prompt_len))
        mask = torch.cat((dense, dense[:, -1:].expand(-1, len(ids) - prompt_len, -1, -1)), dim=1)
        kwargs = {name: value[None] for name, value in pictures.items()} | {"cross_attention_mask": mask}
    with torch.no_grad():
        return hf(input_ids=torch.tensor([ids]), **kwargs).logits[0]


def cross_table(run: ContractDriver, rows: list[tuple[int, int]], count: int) -> torch.Tensor:
    """``[count, WIDTH]``: for each ``(row, keys)`` fresh blocks of the pool (a cross group's own)."""
    table = torch.zeros(count, WIDTH, dtype=torch.int32)
    for row, keys in rows:
        blocks = [run.free[0].pop() for _ in range(math.ceil(keys / BLOCK))]
        table[row, : len(blocks)] = torch.tensor(blocks)
    return table


def close(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_the_class_meets_the_contract_with_tt_metals_mllama_flags(model):
    caps = check_model_class(HostMllamaForConditionalGeneration, owner="test")
    assert (caps.supports_prefix_caching, caps.supports_sample_on_device) == (False, False)
    assert caps.kv_cache_kinds == ("full_attention", "cross_attention")
    assert sorted(model.config.cross_layers) == [1, 3]


def test_the_tiled_tower_and_projector_equal_transformers(model, hf):
    pictures = images(1, [2, 1])
    with torch.no_grad():
        states = hf.model.vision_model(**{k: v[None] for k, v in pictures.items()}).last_hidden_state
        expected = hf.model.multi_modal_projector(states)[0].reshape(2, KEYS_PER_IMAGE, -1)
    close(model.decoder.tower(**pictures), expected)


def test_every_prompt_position_equals_transformers_with_and_without_images(model, hf):
    run = driver(model)
    text = prompt(2, [9])
    close(run.prompt_logits(text, slot=0), hf_logits(hf, text, len(text), None))
    ids, pictures = prompt(3, [5, 7, 4]), images(4, [2, 1])  # text before, between and after the images
    run.add(1, ids)
    table = cross_table(run, [(0, 2 * KEYS_PER_IMAGE)], 1)
    got = run.prefill([(1, len(ids))], return_all_logits=True, cross_page_table=table,
                      **{k: [list(v)] for k, v in pictures.items()})[0]
    close(got, hf_logits(hf, ids, len(ids), pictures))


def test_one_prefill_of_mixed_rows_then_decode_equals_transformers(model, hf):
    """Rows without, with one and with two images prefilled together, then decoded side by side
    in the fixed batch (slot 3 padding); each reads its own cross blocks."""
    run = driver(model)
    cases = [(prompt(5, [8]), None), (prompt(6, [0, 6]), images(7, [2])), (prompt(8, [3, 4, 5]), images(9, [1, 2]))]
    for slot, (ids, _) in enumerate(cases):
        run.add(slot, ids)
    keys = [0 if p is None else p["pixel_values"].shape[0] * KEYS_PER_IMAGE for _, p in cases]
    table = cross_table(run, [(row, k) for row, k in enumerate(keys) if k], 4)
    kwargs = {name: [None if p is None else list(p[name]) for _, p in cases] for name in
              ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}
    run.prefill([(slot, len(ids)) for slot, (ids, _) in enumerate(cases)], cross_page_table=table[:3], **kwargs)
    run.decode(STEPS, cross_page_table=table)
    for slot, (ids, pictures) in enumerate(cases):
        seq = run.seqs[slot]
        expected = hf_logits(hf, seq.history, len(ids), pictures)[len(ids) - 1 : -1]
        close(torch.stack(seq.logits), expected)
    assert run.null_block_untouched()


def test_bad_image_inputs_are_refused_before_any_kv_is_written(model):
    run = driver(model)
    ids, pictures = prompt(10, [2, 3]), images(11, [2, 2])
    run.add(0, ids)
    kwargs = {k: [list(v)] for k, v in pictures.items()}
    table = cross_table(run, [(0, 2 * KEYS_PER_IMAGE)], 1)
    with pytest.raises(HostModelInputError, match=re.escape("2 images sent, the tokens hold 1 <|image|> tokens")):
        run.prefill([(0, len(ids))], cross_page_table=table, **kwargs)
    one = {k: [list(v[:1])] for k, v in pictures.items()}
    with pytest.raises(HostModelInputError, match="has images but the call has no cross_page_table"):
        run.prefill([(0, len(ids))], **one)
    with pytest.raises(HostModelInputError, match="need 5 cross blocks, its cross_page_table row has 4"):
        run.prefill([(0, len(ids))], cross_page_table=table[:, :4], **one)
    assert all(not t.any() for layer in run.kv[0] for t in layer)



def test_a_zero_padded_cross_row_short_of_blocks_is_refused_in_prefill_and_decode(model):
    """A row of the full padded width whose allocation lacks a block (a 0 where a key block
    belongs: padding or the null block) is refused, not read into block 0."""
    run = driver(model)
    ids, pictures = prompt(12, [2, 3]), images(13, [2])
    run.add(0, ids)
    kwargs = {k: [list(v)] for k, v in pictures.items()}
    table = cross_table(run, [(0, KEYS_PER_IMAGE)], 1)
    blocks = math.ceil(KEYS_PER_IMAGE / BLOCK)
    short = table.clone()
    short[0, blocks - 1] = 0
    with pytest.raises(HostModelInputError, match=f"prefill row 0: {KEYS_PER_IMAGE} vision keys need {blocks} "
                                                  f"cross blocks, its cross_page_table row has {blocks - 1}"):
        run.prefill([(0, len(ids))], cross_page_table=short, **kwargs)
    run.prefill([(0, len(ids))], cross_page_table=table, **kwargs)
    decode_short = torch.zeros(model.max_batch_size, WIDTH, dtype=torch.int32)
    decode_short[0] = short[0]
    with pytest.raises(HostModelInputError, match=f"decode row 0: {KEYS_PER_IMAGE} vision keys need {blocks} "
                                                  f"cross blocks, its cross_page_table row has {blocks - 1}"):
        run.decode(1, cross_page_table=decode_short)
    assert run.null_block_untouched()
