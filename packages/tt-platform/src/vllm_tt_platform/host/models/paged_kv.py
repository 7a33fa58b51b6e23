"""The paged KV cache, laid out as tt-metal lays it out.

``kv[lane][layer] = [K, V]``, each ``(num_blocks, kv_heads, block_size, head_dim)``. Position
``p`` of a row lives in block ``page_table[row, p // block_size]`` at offset ``p % block_size``;
block ids index the lane's own cache, so two lanes may use the same ids without meeting.
"""

from __future__ import annotations

import torch

LaneKV = list[list[torch.Tensor]]
"""One lane's cache: per layer, ``[K, V]``."""


def allocate(lanes: int, num_layers: int, shape: tuple[int, int, int, int]) -> list[LaneKV]:
    """Zeroed float32 caches, one per lane (zeros keep unwritten slots finite)."""
    return [[[torch.zeros(shape), torch.zeros(shape)] for _ in range(num_layers)] for _ in range(lanes)]


def block_size(lane_kv: LaneKV) -> int:
    return lane_kv[0][0].shape[2]


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
