"""The TT runner reduced to what the Qwen-VL host-model tests need: one request per slot, its
images as ``pixel_values`` + ``image_grid_thw`` through ``prefill_forward`` (uint8 patches, as
vLLM sends them by default), the returned mRoPE deltas back through ``decode_forward``, and
prompts of text runs with images between them."""

from __future__ import annotations

from typing import Any

import torch

BLOCK = 16
NUM_BLOCKS = 64
PATCH_WIDTH = 96
"""Values per patch of the tiny towers: 3 channels x 2 frames x 4 x 4 pixels."""


def pixels_u8(seed: int, grid: tuple[int, int, int]) -> torch.Tensor:
    """Flattened patches ``[t*h*w, PATCH_WIDTH]`` of a seeded random image."""
    t, h, w = grid
    return torch.randint(0, 256, (t * h * w, PATCH_WIDTH), generator=torch.Generator().manual_seed(seed),
                         dtype=torch.uint8)


def vl_prompt(seed: int, lengths: list[int], grids: tuple[tuple[int, int, int], ...], start: int, image: int,
              end: int) -> list[int]:
    """Text runs of ``lengths`` with an image (``start``, its ``t*h*w/4`` ``image`` tokens,
    ``end``) between each two."""
    gen = torch.Generator().manual_seed(seed)
    ids: list[int] = []
    for k, n in enumerate(lengths):
        if k:
            t, h, w = grids[k - 1]
            ids += [start] + [image] * (t * h * w // 4) + [end]
        ids += torch.randint(3, 290, (n,), generator=gen).tolist()
    return ids


Row = tuple[int, list[int], int, int, list[int | None]]
"""``(slot, ids, start, end, image seeds)``; a None seed: an image inside the prefix-cache hit,
its grid sent without pixels."""


class MropeRunner:
    def __init__(self, model: Any, grids: tuple[tuple[int, int, int], ...]) -> None:
        cfg = model.config
        self.model = model
        self.grids = grids
        self.kv = model.allocate_kv_cache((NUM_BLOCKS, cfg.num_kv_heads, BLOCK, cfg.head_dim), torch.float32,
                                          cfg.num_layers)
        self.table = torch.stack([torch.arange(1 + 8 * s, 9 + 8 * s) for s in range(model.max_batch_size)]).int()

    def prefill(self, rows: list[Row], **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, V] of each row's last position, or [B, T, V] with ``return_all_logits``; deltas)."""
        tokens = torch.zeros(len(rows), max(len(r[1]) for r in rows), dtype=torch.int32)
        for i, (_, ids, *_) in enumerate(rows):
            tokens[i, : len(ids)] = torch.tensor(ids)
        pixels = [[None if s is None else pixels_u8(s, self.grids[k]) for k, s in enumerate(seeds)] or None
                  for *_, seeds in rows]
        grids = [[torch.tensor(self.grids[k]) for k in range(len(seeds))] or None for *_, seeds in rows]
        sent = any(p is not None for row in pixels for p in row or [])
        images = {"pixel_values": pixels} if sent else {}  # as the runner: no key no image of the call has
        out, deltas = self.model.prefill_forward(
            tokens=tokens, page_table=self.table[[r[0] for r in rows]], kv_cache=self.kv,
            prompt_lens=[r[3] for r in rows], start_pos=[r[2] for r in rows], empty_slots=[r[0] for r in rows],
            image_grid_thw=grids, **images, **kwargs,
        )
        return (out if kwargs.get("return_all_logits") else out[:, -1]), deltas

    def decode(self, tokens: dict[int, tuple[int, int]], deltas: list[int]) -> torch.Tensor:
        rows = self.model.max_batch_size
        ids = torch.zeros(rows, 1, dtype=torch.int32)
        start = torch.full((rows,), -1, dtype=torch.int32)
        for slot, (token, pos) in tokens.items():
            ids[slot, 0], start[slot] = token, pos
        return self.model.decode_forward(tokens=ids, start_pos=start, page_table=self.table, kv_cache=self.kv,
                                         rope_deltas_all_users=deltas)[:, -1]
