"""The paged KV cache, laid out as tt-metal lays it out.

``kv[lane][layer] = [K, V]``, each ``(num_blocks, kv_heads, block_size, head_dim)``. Position
``p`` of a row lives in block ``page_table[row, p // block_size]`` at offset ``p % block_size``;
block ids index the lane's own cache, so two lanes may use the same ids without meeting. The
block size is the layer's own (``layer_block_size``): layers may differ in it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

LaneKV = list[list[torch.Tensor]]
"""One lane's cache: per layer, ``[K, V]``."""


def allocate(lanes: int, num_layers: int, shape: tuple[int, int, int, int]) -> list[LaneKV]:
    """Zeroed float32 caches, one per lane (zeros keep unwritten slots finite)."""
    return [[[torch.zeros(shape), torch.zeros(shape)] for _ in range(num_layers)] for _ in range(lanes)]


def tokens_per_block(cache: torch.Tensor) -> int:
    """The block size of one layer's K (or V) cache."""
    return cache.shape[2]


def block_size(lane_kv: Sequence[object]) -> int:
    """The first paged layer's block size (a model whose layers all share one)."""
    return tokens_per_block(_first_paged(lane_kv)[0])


def layer_block_size(lane_kv: Sequence[object], layer: int) -> int:
    """Layer ``layer``'s own block size: vLLM gives the smaller-page layers of a hybrid model
    (Gemma 4's sliding ones) more tokens per block so every page holds as many bytes. A
    recurrent-state layer, whose table numbers states, not tokens, answers ``block_size``."""
    cache = lane_kv[layer]
    return tokens_per_block(cache[0]) if isinstance(cache, list) else block_size(lane_kv)


def num_blocks(lane_kv: Sequence[object]) -> int:
    return _first_paged(lane_kv)[0].shape[0]


def _first_paged(lane_kv: Sequence[object]) -> list[torch.Tensor]:
    """The first layer's ``[K, V]`` that is a paged cache: a recurrent-state layer (Qwen 3.5's
    delta-net, ``gated_delta.RecurrentState``) holds no blocks of tokens."""
    for layer in lane_kv:
        if isinstance(layer, list):
            return layer
    raise ValueError("the KV cache has no paged attention layer")


def locate(page_rows: torch.Tensor, positions: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Block id and in-block offset of ``positions [n]``, each read from its own page row
    ``page_rows [n, width]``."""
    pages = page_rows.gather(1, (positions // size)[:, None])[:, 0]
    return pages, positions % size


def write(cache: torch.Tensor, pages: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
    """Store ``values [n, kv_heads, head_dim]`` at ``(pages[i], offsets[i])``."""
    cache[pages, :, offsets, :] = values


def gather(cache: torch.Tensor, page_rows: torch.Tensor) -> torch.Tensor:
    """The blocks of ``page_rows [b, nblk]`` laid end to end: ``[b, kv_heads, nblk*bs, head_dim]``.

    Entries past a row's own length may be padding of any value; they are clamped into range
    and must be masked by the caller.
    """
    blocks = cache[page_rows.clamp(0, cache.shape[0] - 1)]
    b, nblk, heads, size, dim = blocks.shape
    return blocks.permute(0, 2, 1, 3, 4).reshape(b, heads, nblk * size, dim)


def key_span(page_rows: torch.Tensor, first_block: torch.Tensor, count: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` blocks of each row from ``first_block [b]`` on: their ids ``[b, count]``
    and the position of every key in them ``[b, count * size]``.

    A sliding-window layer starts at the first block its window reaches, so blocks vLLM has
    dropped (null entries) are never read. Columns past the table's width repeat its last
    entry; their positions lie past every query, so the caller's mask hides them."""
    columns = first_block[:, None] + torch.arange(count)
    pages = page_rows.gather(1, columns.clamp(max=page_rows.shape[1] - 1))
    key_pos = (columns[:, :, None] * size + torch.arange(size)).reshape(columns.shape[0], -1)
    return pages, key_pos


def first_block(positions: torch.Tensor, window: int | None, size: int) -> torch.Tensor:
    """The first block a query at ``positions`` reads: 0 for full attention, else the block of
    its oldest visible key ``p - window + 1``."""
    if window is None:
        return torch.zeros_like(positions)
    return (positions - window + 1).clamp(min=0) // size


def visible(
    key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None, blocks: torch.Tensor | None = None,
    blocks_past_window: bool = False,
) -> torch.Tensor:
    """Causal mask ``[b, q, k]``: a query at ``p`` sees keys ``[0, p]``, or ``(p - window, p]``
    on a sliding-window layer (HF's convention: itself and the ``window - 1`` keys before it).

    ``blocks [positions]`` (one row's), when given, numbers bidirectional blocks (-1: none):
    a query also sees the later keys of its own block (Gemma 3's image tokens), the window
    still applying to earlier keys, or (``blocks_past_window``, Gemma 4 Unified) not: the query
    sees its whole block. Positions past its end belong to no block."""
    keys = key_pos[:, None, :]
    queries = query_pos[:, :, None]
    mask = keys <= queries
    in_window = keys > queries - window if window is not None else None
    if blocks is not None:
        padded = torch.cat((blocks, blocks.new_full((1,), -1)))
        block_of = padded[key_pos.clamp(max=blocks.shape[0])]
        query_block = padded[query_pos.clamp(max=blocks.shape[0])]
        same = (block_of[:, None, :] == query_block[:, :, None]) & (query_block[:, :, None] >= 0)
        if blocks_past_window and in_window is not None:
            return (mask & in_window) | same
        mask |= same
    if in_window is not None:
        mask &= in_window
    return mask
