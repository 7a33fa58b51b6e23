"""Llama 3.2 Vision (``MllamaForConditionalGeneration``) on the host decoder.

The text side is Llama's decoder, except that the layers ``cross_attention_layers`` attend to
the projected vision states (``vision``) instead of to the text: q from the text (per-head
RMSNorm, no rotation), k and v from the vision states (k RMSNorm'd), the attention and then the
MLP each added through a ``tanh`` gate. The image tokens never enter the text sequence: one
``<|image|>`` per image marks where the text starts seeing it, and the vision K/V live in a
cross-attention KV cache of their own, written once at prefill through the cross page table
(``cross_page_table``, tt-metal's contract; vLLM's ``CrossAttentionSpec`` group) and read on
every later step. As transformers does: a row without images skips the cross layers; a text
position that sees no image (before the first ``<|image|>``) attends to every vision key but
adds no cross MLP; a decode token sees what the prompt's last token saw.

A prefill row's images come as ``pixel_values`` (per image ``[max_num_tiles, 3, size, size]``,
normalised, unused tiles zero), ``aspect_ratio_ids`` and ``aspect_ratio_mask`` (the valid
tiles), as transformers' ``MllamaImageProcessor`` makes them. Rows with images are prefilled
whole (``start_pos`` 0: no prefix caching, no chunks, as vLLM schedules encoder-decoder models).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm_tt_models_registry.contract import CROSS_PAGE_TABLE_KWARG

from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.checkpoint import (
    CheckpointError,
    DecoderWeights,
    LayerWeights,
    WeightFolder,
    check_shapes,
    load_layer_weights,
)
from vllm_tt_host.models.frame.decoder import DecodeRows, HostDecoder, PrefillInserts, PrefillPass
from vllm_tt_host.models.frame.generator import HostCausalLM
from vllm_tt_host.models.frame.hybrid_kv import layer_name
from vllm_tt_host.models.frame.inputs import PrefillRow
from vllm_tt_host.models.frame.mlp import gated_mlp
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.shapes import HostModelInputError
from vllm_tt_host.models.frame.vision import per_row
from vllm_tt_host.models.mllama import CAPABILITIES
from vllm_tt_host.models.mllama.config import MllamaConfig
from vllm_tt_host.models.mllama.processor import (
    IMAGE_TOKEN,
    MllamaDummyInputsBuilder,
    MllamaMultiModalProcessor,
    MllamaProcessingInfo,
)
from vllm_tt_host.models.mllama.vision import MllamaVisionTower, load_mllama_vision_weights

LAYOUTS: tuple[tuple[str, str, str, str], ...] = (
    ("language_model.model.", "language_model.lm_head.weight", "vision_model.", "multi_modal_projector."),
    ("model.language_model.", "lm_head.weight", "model.vision_model.", "model.multi_modal_projector."),
)
"""(text decoder, lm_head, vision tower, projector) names: as transformers saves Mllama (and the
hub checkpoints hold it), and as its modules are named."""
IMAGE_KWARGS: tuple[str, ...] = ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")


@dataclass(frozen=True)
class CrossLayerWeights(LayerWeights):
    """A cross-attention layer: ``attention`` is ``cross_attn`` (with q and k norms)."""

    attn_gate: torch.Tensor
    mlp_gate: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class CrossInserts(PrefillInserts):
    """A prefill row's images as the cross-attention layers read them (no embedding is replaced)."""

    states: torch.Tensor
    """``[keys, hidden]``: the projected vision states of the row's images, image by image."""
    visible: torch.Tensor
    """``[end, keys]`` bool: the keys each position sees (transformers' ``cross_attention_mask``)."""
    cross_row: torch.Tensor
    """The row's cross page table: key ``j`` lives at block ``cross_row[j // block_size]``."""


def cross_visibility(ids: torch.Tensor, valid_tiles: list[int], image_token_id: int, max_tiles: int,
                     patches: int, row: int) -> torch.Tensor:
    """``[len(ids), images * max_tiles * patches]`` bool: which vision keys each text position
    sees. Image ``k`` is seen from its ``<|image|>`` up to the next one (consecutive
    ``<|image|>`` tokens share their span), only its ``valid_tiles[k]`` first tiles."""
    marks = (ids == image_token_id).nonzero().flatten().tolist()
    if len(marks) != len(valid_tiles):
        raise HostModelInputError(f"prefill row {row}: {len(valid_tiles)} images sent, the tokens hold "
                                  f"{len(marks)} <|image|> tokens (one per image)")
    length = ids.shape[0]
    ends = [*marks[1:], length]
    for k in range(len(marks) - 2, -1, -1):
        if marks[k + 1] == marks[k] + 1:  # consecutive image tokens see on to the group's end
            ends[k] = ends[k + 1]
    tiles = torch.zeros(length, len(marks), max_tiles, dtype=torch.bool)
    for k, (first, stop) in enumerate(zip(marks, ends, strict=True)):
        tiles[first:stop, k, : valid_tiles[k]] = True
    return tiles.repeat_interleave(patches, dim=2).reshape(length, -1)


class MllamaDecoder(HostDecoder):
    config: MllamaConfig

    def __init__(self, config: MllamaConfig, weights: DecoderWeights, tower: MllamaVisionTower) -> None:
        super().__init__(config, weights)
        self.tower = tower
        self.slot_visible: list[torch.Tensor | None] = []
        """Per decode slot: the vision keys its decode tokens see (its prompt's last position's;
        None: no images). Set by the model after each prefill."""
        self.cross_tables = torch.zeros(0, 0, dtype=torch.int32)
        """The decode call's ``cross_page_table`` (set by the model before each decode)."""

    @classmethod
    def load(cls, folder: Path, config: MllamaConfig) -> HostDecoder:
        return load_mllama_decoder(folder, config)

    def row_inserts(self, ids: torch.Tensor, start: int, images: dict[str, Any] | None, cross_row: torch.Tensor,
                    lane_kv: LaneKV, row: int) -> CrossInserts | None:
        """Row ``row``'s images (``IMAGE_KWARGS``, None: a text-only row) with its token history
        ``ids`` and cross page row, checked before any KV is written."""
        if images is None:
            return None
        if start:
            raise HostModelInputError(f"prefill row {row}: a row with images starts at position 0 (start_pos "
                                      f"{start}): Mllama's vision K/V are written by the prompt's one prefill")
        vision = self.config.vision
        pixels = _stack(images["pixel_values"], "pixel_values", row)
        ratio_ids = _stack(images["aspect_ratio_ids"], "aspect_ratio_ids", row).reshape(-1)
        tile_mask = _stack(images["aspect_ratio_mask"], "aspect_ratio_mask", row).reshape(pixels.shape[0], -1)
        visible = cross_visibility(ids, [int(m) for m in tile_mask.sum(-1).tolist()], self.config.image_token_id,
                                   vision.max_num_tiles, vision.patches, row)
        _check_cross_pages(cross_row, visible.shape[1], f"prefill row {row}", lane_kv)
        states = self.tower(pixels, ratio_ids, tile_mask)
        empty = torch.zeros(0, dtype=torch.long)
        return CrossInserts(index=empty, vectors=torch.zeros(0, self.config.hidden_size),
                            blocks=torch.full((ids.shape[0],), -1, dtype=torch.long),
                            states=states.reshape(-1, states.shape[-1]), visible=visible, cross_row=cross_row)

    def _prefill_layer(self, index: int, layer: LayerWeights, x: torch.Tensor, layer_kv: list[torch.Tensor],
                       page_row: torch.Tensor, row: PrefillPass, layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """A cross layer writes the row's vision K/V to its cross blocks, then reads them back."""
        if not isinstance(layer, CrossLayerWeights):
            return super()._prefill_layer(index, layer, x, layer_kv, page_row, row, layer_input)
        inserts = row.inserts
        if not isinstance(inserts, CrossInserts):
            return x  # a text-only row: transformers skips the layer
        k_cache, v_cache = layer_kv
        count, size = inserts.states.shape[0], paged_kv.tokens_per_block(k_cache)
        k, v = self._cross_kv(inserts.states, layer)
        pages, offsets = paged_kv.locate(inserts.cross_row[None].expand(count, -1).long(), torch.arange(count), size)
        paged_kv.write(k_cache, pages, offsets, k)
        paged_kv.write(v_cache, pages, offsets, v)
        used = inserts.cross_row[None, : math.ceil(count / size)].long()
        keys, values = paged_kv.gather(k_cache, used), paged_kv.gather(v_cache, used)
        seen = inserts.visible[row.query_pos[0]]
        return self._cross(x, layer, keys, values, _key_mask(seen, count, keys.shape[2])[None, None], seen.any(-1))

    def _decode_layer(self, index: int, layer: LayerWeights, x: torch.Tensor, step: DecodeRows,
                      page_table: torch.Tensor, kv: list[LaneKV], layer_input: torch.Tensor | None = None) -> torch.Tensor:
        """A cross layer reads each row's vision K/V through ``cross_tables``; rows without images
        (and padding rows) keep their states."""
        if not isinstance(layer, CrossLayerWeights):
            return super()._decode_layer(index, layer, x, step, page_table, kv, layer_input)
        seen = [self.slot_visible[r] if bool(step.live[r]) else None for r in range(x.shape[0])]
        counts = torch.tensor([0 if s is None else s.shape[0] for s in seen])
        if not int(counts.max()):
            return x
        size = paged_kv.tokens_per_block(kv[0][index][0])
        blocks = math.ceil(int(counts.max()) / size)
        width = blocks * size
        visible = torch.zeros(x.shape[0], width, dtype=torch.bool)
        for r, s in enumerate(seen):
            if s is not None:
                visible[r, : s.shape[0]] = s
        keys, values = [], []
        for lane, rows in enumerate(step.lanes):
            k_cache, v_cache = kv[lane][index]
            used = self.cross_tables[rows, :blocks].long()
            keys.append(paged_kv.gather(k_cache, used))
            values.append(paged_kv.gather(v_cache, used))
        mask = torch.stack([_key_mask(visible[r : r + 1], int(counts[r]), width)[0] for r in range(x.shape[0])])
        out = self._cross(x[:, None], layer, torch.cat(keys), torch.cat(values), mask[:, None, None],
                          visible.any(-1)[:, None])
        return torch.where((counts > 0)[:, None], out[:, 0], x)

    def _cross_kv(self, states: torch.Tensor, layer: CrossLayerWeights) -> tuple[torch.Tensor, torch.Tensor]:
        """The vision states ``[keys, hidden]`` as one layer's keys (k-normed) and values."""
        a, c = layer.attention, self.config
        k = F.linear(states, a.k).view(-1, c.num_kv_heads, c.head_dim)
        v = F.linear(states, a.v).view(-1, c.num_kv_heads, c.head_dim)
        assert a.k_norm is not None  # cross layers load their norms (load_mllama_decoder)
        return self._norm(k, a.k_norm), v

    def _cross(self, x: torch.Tensor, layer: CrossLayerWeights, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor, text_live: torch.Tensor) -> torch.Tensor:
        """``x [B, T, hidden]`` (prefill: B = 1 row's bucket as T; decode: T = 1) through one gated
        cross layer over ``keys``/``values [B, kv_heads, K, d]`` under ``mask [B, 1, T, K]``;
        ``text_live [B, T]``: positions that see an image (the others add no cross MLP)."""
        batched = x.dim() == 3
        x = x if batched else x[None]
        text_live = text_live if batched else text_live[None]
        a, c = layer.attention, self.config
        batch, tokens, _ = x.shape
        assert a.q_norm is not None
        q = self._norm(F.linear(self._norm(x, layer.input_norm), a.q).view(batch, tokens, c.num_heads, c.head_dim),
                       a.q_norm)
        out = self._attend(q.transpose(1, 2), keys, values, mask, 0).transpose(1, 2).reshape(batch, tokens, -1)
        x = x + layer.attn_gate.tanh() * F.linear(out, a.o)
        mlp = gated_mlp(self._norm(x, layer.post_attention_norm), layer.mlp) * text_live[..., None]
        x = x + layer.mlp_gate.tanh() * mlp
        return x if batched else x[0]


def _key_mask(seen: torch.Tensor, count: int, width: int) -> torch.Tensor:
    """``seen [T, count]`` -> ``[T, width]``: the keys past ``count`` hidden; a position that sees
    no image sees every key (transformers zeroes its mask row, then zeroes its cross MLP)."""
    mask = torch.zeros(seen.shape[0], width, dtype=torch.bool)
    mask[:, :count] = seen[:, :count]
    mask[~seen.any(-1), :count] = True
    return mask


def _stack(value: Any, name: str, row: int) -> torch.Tensor:
    """One row's per-image tensors (a list, or already stacked) as one tensor."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise HostModelInputError(f"prefill row {row}: {name} is an empty list")
        return torch.stack([torch.as_tensor(v) for v in value])
    return torch.as_tensor(value)


def _check_cross_pages(cross_row: torch.Tensor, keys: int, where: str, lane_kv: LaneKV) -> None:
    """The row's first blocks hold all ``keys`` vision keys, inside the lane's pool. The runner
    zero-pads table rows and block 0 is vLLM's null block in every lane, so a 0 among them is a
    block the allocation does not have (the padded width alone would let the keys spill into it)."""
    blocks = math.ceil(keys / paged_kv.block_size(lane_kv))
    pages = cross_row[:blocks]
    if int((pages != 0).sum()) < blocks:
        raise HostModelInputError(f"{where}: {keys} vision keys need {blocks} cross blocks, its cross_page_table "
                                  f"row has {int((cross_row != 0).sum())}: {cross_row.tolist()}")
    count = paged_kv.num_blocks(lane_kv)
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= count):
        raise HostModelInputError(f"cross_page_table ({where}) points outside the {count} KV blocks: {pages.tolist()}")


def load_mllama_decoder(folder: Path, config: MllamaConfig) -> MllamaDecoder:
    reader = WeightFolder(folder)
    layout = next((names for names in LAYOUTS if names[0] + "embed_tokens.weight" in reader), None)
    if layout is None:
        raise CheckpointError(f"no Mllama text decoder in {folder}: looked for embed_tokens.weight under "
                              f"{', '.join(names[0] for names in LAYOUTS)}")
    text, lm_head, vision, projector = layout
    layers: list[LayerWeights] = []
    for i in range(config.num_layers):
        p = f"{text}layers.{i}."
        if not config.is_cross(i):
            layers.append(load_layer_weights(reader, p, config))
            continue
        base = load_layer_weights(reader, p, config, attention="cross_attn.", qk_norm=True)
        layers.append(CrossLayerWeights(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)},
                                        attn_gate=reader.tensor(p + "cross_attn_attn_gate"),
                                        mlp_gate=reader.tensor(p + "cross_attn_mlp_gate")))
    embed = reader.tensor(text + "embed_tokens.weight")
    weights = DecoderWeights(embed=embed, layers=tuple(layers), norm=reader.tensor(text + "norm.weight"),
                             lm_head=embed[: config.vocab_size] if config.tie_word_embeddings else reader.tensor(lm_head))
    c = config
    check_shapes({
        text + "embed_tokens.weight": (embed, (c.embed_rows, c.hidden_size)),
        lm_head: (weights.lm_head, (c.vocab_size, c.hidden_size)),
        "layers.*.mlp.up_proj.weight": (layers[0].mlp.up, (c.intermediate_size, c.hidden_size)),
    }, folder)
    tower = MllamaVisionTower(c.vision, load_mllama_vision_weights(reader, vision, projector, c.vision))
    if tower.weights.projector.weight.shape[0] != c.hidden_size:
        raise CheckpointError(f"{projector}weight in {folder} projects to {tower.weights.projector.weight.shape[0]}, "
                              f"the text decoder is {c.hidden_size} wide")
    return MllamaDecoder(c, weights, tower)


@MULTIMODAL_REGISTRY.register_processor(MllamaMultiModalProcessor, info=MllamaProcessingInfo,
                                        dummy_inputs=MllamaDummyInputsBuilder)
class HostMllamaForConditionalGeneration(HostCausalLM):
    """Llama 3.2 Vision: prefill rows carry ``IMAGE_KWARGS`` and ``cross_page_table``; decode
    takes ``cross_page_table``. Declares tt-metal's Mllama capabilities (no prefix caching, no
    device sampling) and no more than its tests prove; its KV spec puts the cross-attention
    layers in vLLM's ``CrossAttentionSpec`` group (``processor``: vLLM's multimodal side)."""

    supports_multimodal: ClassVar[bool] = True

    family = "llama"
    config_type = MllamaConfig
    decoder_type = MllamaDecoder
    decoder: MllamaDecoder
    model_capabilities: ClassVar[dict[str, Any]] = dict(CAPABILITIES)

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        """What a chat message's image part becomes in the prompt text."""
        return IMAGE_TOKEN if modality.startswith("image") else None

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any]:
        """``FullAttentionSpec`` for the self-attention layers, ``CrossAttentionSpec`` for the
        cross-attention layers (vLLM allocates those once per request, its vision keys)."""
        from vllm.v1.kv_cache_interface import CrossAttentionSpec, FullAttentionSpec

        config = MllamaConfig.read(vllm_config.model_config.hf_config)
        common = {"block_size": vllm_config.cache_config.block_size, "num_kv_heads": config.num_kv_heads,
                  "head_size": config.head_dim, "dtype": vllm_config.model_config.dtype}
        return {layer_name(i): CrossAttentionSpec(**common) if config.is_cross(i) else FullAttentionSpec(**common)
                for i in range(config.num_layers)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decoder.slot_visible = [None] * self.max_batch_size
        self._call_kv: list[LaneKV] = []
        self._call_visible: list[torch.Tensor | None] = []
        """The prefill call in progress: its KV cache, and each row's decode visibility
        (``prefill_inserts`` computes it)."""

    def prefill_inserts(self, tokens: torch.Tensor, rows: list[PrefillRow], kwargs: dict[str, Any],
                        ) -> list[PrefillInserts | None]:
        count = len(rows)
        per_image = {name: per_row(kwargs.get(name), count, name) for name in IMAGE_KWARGS}
        cross = kwargs.get(CROSS_PAGE_TABLE_KWARG)
        inserts: list[PrefillInserts | None] = []
        for i, row in enumerate(rows):
            images = {name: per_image[name][i] for name in IMAGE_KWARGS}
            if images["pixel_values"] is None or self.synthetic is not None:
                inserts.append(None)
                continue
            if any(value is None for value in images.values()):
                raise HostModelInputError(f"prefill row {i}: images need all of {', '.join(IMAGE_KWARGS)}")
            if cross is None:
                raise HostModelInputError(f"prefill row {i} has images but the call has no cross_page_table")
            inserts.append(self.decoder.row_inserts(tokens[i, : row.end].long(), row.start, images,
                                                    _cross_rows(cross, count)[i], self._call_kv[row.lane], i))
        self._call_visible = [r.visible[-1] if isinstance(r, CrossInserts) else None for r in inserts]
        return inserts

    def prefill_forward(self, tokens: Any, page_table: Any, kv_cache: Any, prompt_lens: Any, start_pos: Any = None,
                        empty_slots: Any = None, sampling_params: Any = None, enable_trace: bool = False,
                        **kwargs: Any) -> Any:
        """As ``HostCausalLM.prefill_forward``, with ``cross_page_table [B, width]`` for the rows
        with images; each slot then keeps what its decode tokens see."""
        self._call_kv = kv_cache
        out = super().prefill_forward(tokens, page_table, kv_cache, prompt_lens, start_pos, empty_slots,
                                      sampling_params, enable_trace, **kwargs)
        count = torch.as_tensor(tokens).shape[0]
        slots = list(range(count)) if empty_slots is None else [int(s) for s in torch.as_tensor(empty_slots).tolist()]
        for slot, visible in zip(slots, self._call_visible, strict=True):
            self.decoder.slot_visible[slot] = visible
        return out

    def decode_forward(self, tokens: Any, start_pos: Any, page_table: Any, kv_cache: Any, enable_trace: bool = False,
                       read_from_device: bool = True, sampling_params: Any = None, prompt_tokens: Any = None,
                       output_tokens: Any = None, reset_batch: bool = False, **kwargs: Any) -> Any:
        """As ``HostCausalLM.decode_forward``, with ``cross_page_table [B, width]`` (every row
        with images reads its vision K/V through it)."""
        cross = kwargs.pop(CROSS_PAGE_TABLE_KWARG, None)
        positions = torch.as_tensor(start_pos).reshape(-1)
        needs = [r for r, seen in enumerate(self.decoder.slot_visible) if seen is not None and int(positions[r]) >= 0]
        if needs and cross is None:
            raise HostModelInputError(f"decode rows {needs} have images but the call has no cross_page_table")
        if cross is not None:
            table = _cross_rows(cross, self.max_batch_size)
            for r in needs:
                seen = self.decoder.slot_visible[r]
                assert seen is not None
                _check_cross_pages(table[r], seen.shape[0], f"decode row {r}", kv_cache[self.lanes.lane_of(r)])
            self.decoder.cross_tables = table
        return super().decode_forward(tokens, start_pos, page_table, kv_cache, enable_trace, read_from_device,
                                      sampling_params, prompt_tokens, output_tokens, reset_batch, **kwargs)


def _cross_rows(cross_page_table: Any, rows: int) -> torch.Tensor:
    table = torch.as_tensor(cross_page_table)
    if table.dim() != 2 or table.shape[0] < rows:
        raise HostModelInputError(f"cross_page_table has shape {tuple(table.shape)}; expected [rows >= {rows}, width]")
    return table[:rows]
