"""What a forward call's inputs must look like, checked before any KV is written.

The runner sends numpy arrays, lists or tensors; these checks turn a wrong shape, a slot
outside the batch or a page outside the cache into an error that names it, instead of an
index error deep in the attention math (or, worse, a silent write into another row's blocks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vllm_tt_host.models.frame import paged_kv
from vllm_tt_host.models.frame.lanes import LaneLayout
from vllm_tt_host.models.frame.paged_kv import LaneKV
from vllm_tt_host.models.frame.shapes import HostModelInputError, prefill_bucket


@dataclass(frozen=True)
class PrefillRow:
    """One checked prefill row: compute ``[start, end)`` on ``lane``, padded to ``bucket``."""

    lane: int
    start: int
    end: int
    bucket: int


def check_kv_shape(shape: tuple[int, ...], num_layers: int, cfg: Any, layer: int = 0) -> tuple[int, int]:
    """Check ``allocate_kv_cache``'s arguments against the model config ``cfg`` (for
    ``layer``: layers may differ in head size and KV heads); returns ``(num_blocks,
    block_size)``. The shape may carry one device's share of the KV heads."""
    if len(shape) != 4:
        raise HostModelInputError(f"kv_cache_shape must be (num_blocks, kv_heads, block_size, head_dim), got {shape}")
    num_blocks, heads, block_size, head_dim = (int(v) for v in shape)
    if num_layers != cfg.num_layers:
        raise HostModelInputError(f"num_layers={num_layers}, but the model has {cfg.num_layers} layers")
    want_dim, want_heads = cfg.head_dim_of(layer), cfg.kv_heads_of(layer)
    if head_dim != want_dim or heads < 1 or want_heads % heads:
        raise HostModelInputError(
            f"kv_cache_shape {tuple(shape)} does not fit the model: expected "
            f"head_dim {want_dim} and a divisor of its {want_heads} kv heads"
        )
    if num_blocks < 1 or block_size < 1:
        raise HostModelInputError(f"kv_cache_shape {tuple(shape)} has an empty dimension")
    return num_blocks, block_size


def check_kv(kv_cache: Any, lanes: LaneLayout) -> None:
    if not isinstance(kv_cache, (list, tuple)) or len(kv_cache) != lanes.count:
        raise HostModelInputError(
            f"kv_cache must be the object allocate_kv_cache returned ({lanes.count} lane(s))"
        )


def layer_tables(page_table: torch.Tensor, per_layer: Any, num_layers: int, rows: int) -> list[torch.Tensor]:
    """One page table per layer, cut to the call's ``rows``: the runner's
    ``page_tables_per_layer`` (hybrid KV: one block table per KV cache group, padded to the
    warmup batch) when it sends them, else ``page_table`` for every layer."""
    if per_layer is None:
        return [page_table] * num_layers
    tables = [torch.as_tensor(t) for t in per_layer]
    if len(tables) != num_layers:
        raise HostModelInputError(f"page_tables_per_layer has {len(tables)} tables, the model has {num_layers} layers")
    for index, table in enumerate(tables):
        if table.dim() != 2 or table.shape[0] < rows:
            raise HostModelInputError(
                f"page_tables_per_layer[{index}] has shape {tuple(table.shape)}; expected [rows >= {rows}, width]"
            )
    return [table[:rows] for table in tables]


def plan_prefill(
    tokens: torch.Tensor,
    page_tables: Sequence[torch.Tensor],
    kv_cache: list[LaneKV],
    prompt_lens: Any,
    start_pos: Any,
    empty_slots: Any,
    lanes: LaneLayout,
    max_seq_len: int,
) -> list[PrefillRow]:
    """Check every row of a prefill call (against each layer's page table) and pick its lane
    and bucket."""
    count = tokens.shape[0]
    ends = _ints(prompt_lens)
    starts = [0] * count if start_pos is None else _ints(start_pos)
    slots = list(range(count)) if empty_slots is None else _ints(empty_slots)
    if not len(ends) == len(starts) == len(slots) == page_tables[0].shape[0] == count:
        raise HostModelInputError(
            f"prefill rows disagree: tokens {count}, prompt_lens {len(ends)}, start_pos "
            f"{len(starts)}, empty_slots {len(slots)}, page_table {page_tables[0].shape[0]}"
        )
    tables = _tables_by_block_size(page_tables, kv_cache[0])  # every lane's cache has the same shapes
    rows = []
    for i, (start, end, slot) in enumerate(zip(starts, ends, slots, strict=True)):
        if not 0 <= start < end <= min(tokens.shape[1], max_seq_len):
            raise HostModelInputError(
                f"prefill row {i}: need 0 <= start_pos ({start}) < prompt_len ({end}) <= "
                f"min(tokens width {tokens.shape[1]}, max_seq_len {max_seq_len})"
            )
        lane = lanes.lane_of(slot)
        for table, size in tables:
            blocks = -(-end // size)
            if blocks > table.shape[1]:
                raise HostModelInputError(
                    f"prefill row {i} needs {blocks} blocks of {size} tokens, the page table has {table.shape[1]}"
                )
            _check_pages(table[i, :blocks], f"row {i}", kv_cache[lane])
        rows.append(PrefillRow(lane, start, end, prefill_bucket(end - start)))
    return rows


def check_decode(
    tokens: torch.Tensor,
    positions: torch.Tensor,
    page_tables: Sequence[torch.Tensor],
    kv_cache: list[LaneKV],
    lanes: LaneLayout,
    max_seq_len: int,
) -> None:
    """Decode always carries the full fixed batch (the traced shape); live rows must find
    the block of their position in their lane's cache, in every layer's page table."""
    batch = lanes.max_batch_size
    page_table = page_tables[0]
    if not tokens.shape[0] == positions.shape[0] == page_table.shape[0] == batch:
        raise HostModelInputError(
            f"decode runs the full fixed batch of {batch} rows (a traced shape); got tokens "
            f"{tokens.shape[0]}, start_pos {positions.shape[0]}, page_table "
            f"{page_table.shape[0]} rows. Pad with start_pos=-1 rows"
        )
    if int(positions.max()) >= max_seq_len:
        raise HostModelInputError(f"decode position {int(positions.max())} is past max_seq_len {max_seq_len}")
    tables = _tables_by_block_size(page_tables, kv_cache[0])  # every lane's cache has the same shapes
    for lane in range(lanes.count):
        rows = lanes.rows(lane)
        lane_pos = positions[rows.start : rows.stop]
        live = lane_pos >= 0
        for table, size in tables:
            blocks = lane_pos[live] // size
            if blocks.numel() and int(blocks.max()) >= table.shape[1]:
                raise HostModelInputError(
                    f"decode needs block {int(blocks.max())}, the page table has {table.shape[1]} per row"
                )
            pages = table[rows.start : rows.stop][live].gather(1, blocks[:, None])
            _check_pages(pages.reshape(-1), f"lane {lane}", kv_cache[lane])


def prompt_history(tokens: torch.Tensor, ends: list[int]) -> torch.Tensor:
    """Each row's tokens up to its prompt length, ``-1`` after: the penalty history."""
    history = tokens.long().clone()
    columns = torch.arange(tokens.shape[1])[None, :]
    history[columns >= torch.tensor(ends)[:, None]] = -1
    return history


def _tables_by_block_size(tables: Sequence[torch.Tensor], lane_kv: LaneKV) -> list[tuple[torch.Tensor, int]]:
    """Each layer's table with its layer's block size, each pair once (without hybrid KV every
    layer shares one table; with mixed page sizes a group's layers share one block size)."""
    pairs = {(id(t), paged_kv.layer_block_size(lane_kv, layer)): t for layer, t in enumerate(tables)}
    return [(table, size) for (_, size), table in pairs.items()]


def _ints(values: Any) -> list[int]:
    return [int(v) for v in torch.as_tensor(values).reshape(-1).tolist()]


def _check_pages(pages: torch.Tensor, where: str, lane_kv: LaneKV) -> None:
    num_blocks = paged_kv.num_blocks(lane_kv)
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_blocks):
        raise HostModelInputError(
            f"page_table ({where}) points outside the {num_blocks} KV blocks: {pages.tolist()}"
        )
