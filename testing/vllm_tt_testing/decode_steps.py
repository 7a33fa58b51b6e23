"""Set-up shared by the host tests that compare a multi-token decode step (a verify step, a
block-output step) with consecutive plain decode steps: prompts prefilled into contiguous pages,
and copies of the paged KV so both runs start from the same cache."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def prefilled(model: Any, kv: Any, prompts: Sequence[list[int]], rows: int,
              width: int) -> tuple[torch.Tensor, list[int]]:
    """Prefill ``prompts`` into slots 0.. (slot ``s`` owns pages ``1 + s * width`` onwards);
    returns the ``[rows, width]`` page table and each prompt's greedy next token."""
    table = torch.zeros(rows, width, dtype=torch.int32)
    for slot in range(len(prompts)):
        table[slot] = torch.arange(1 + slot * width, 1 + (slot + 1) * width)
    tokens = torch.zeros(len(prompts), max(len(p) for p in prompts), dtype=torch.int32)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p)
    out = model.prefill_forward(tokens=tokens, page_table=table[: len(prompts)], kv_cache=kv,
                                prompt_lens=[len(p) for p in prompts], start_pos=[0] * len(prompts),
                                empty_slots=list(range(len(prompts))))
    return table, [int(out[i, -1].argmax()) for i in range(len(prompts))]


def clone_kv(kv: Any) -> Any:
    """A copy of a host model's paged KV (per lane, per layer, K and V)."""
    return [[[t.clone() for t in pair] for pair in lane] for lane in kv]
