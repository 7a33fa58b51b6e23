"""Structured-output bitmasks (xgrammar's packed format) applied to host logits rows.

Each bitmask row is ``ceil(vocab / 32)`` int32 words; bit ``t % 32`` of word ``t // 32`` set
means token ``t`` is allowed. Unpacked with torch so no grammar backend kernel is needed on host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_BITS = torch.arange(32, dtype=torch.int32)


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``[rows, words]`` int32 bitmask -> ``[rows, min(vocab, 32 * words)]`` bool, True = allowed."""
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_grammar_bitmask(logits: torch.Tensor, bitmask: np.ndarray, rows: Sequence[int | None]) -> None:
    """Mask disallowed tokens to -inf in place. ``rows[j]`` is the logits row that bitmask row
    ``j`` constrains, or None when that request is not sampled in this call. Tokens beyond the
    bitmask's width are left alone, as xgrammar does."""
    if bitmask.ndim != 2 or bitmask.shape[0] != len(rows):
        raise ValueError(
            f"grammar bitmask has shape {bitmask.shape}; expected one row per structured "
            f"request ({len(rows)}). Speculative-decoding bitmasks are not supported."
        )
    pairs = [(j, row) for j, row in enumerate(rows) if row is not None]
    if not pairs:
        return
    mask_rows = torch.tensor([j for j, _ in pairs], dtype=torch.int64)
    logit_rows = torch.tensor([row for _, row in pairs], dtype=torch.int64)
    packed = torch.from_numpy(np.ascontiguousarray(bitmask, dtype=np.int32))[mask_rows]
    allowed = allowed_tokens(packed, logits.shape[1])
    width = allowed.shape[1]
    masked = logits[logit_rows, :width].masked_fill(~allowed, float("-inf"))
    logits[logit_rows, :width] = masked
