"""Greedy acceptance of drafts from the target's own tokens: device-side verification.

When every row of a verify step (speculative decoding) is greedy, vLLM's rejection sampler
needs nothing of the logits but their argmax at each position: it keeps a row's drafts while
each equals the target's token at its position, then appends the target's token where the
first draft differs (the correction) or after the last draft (the bonus). So a device that
returns its argmax after each of the ``1 + K`` positions (token ids, not ``[rows, 1 + K,
vocab]`` logits) lets the host finish the step with this function alone. Pure Python: no
torch, no vLLM.
"""

from __future__ import annotations

from collections.abc import Sequence


def accept_greedy(targets: Sequence[Sequence[int]], drafts: Sequence[Sequence[int]]) -> list[list[int]]:
    """Each row's tokens: its drafts up to the first that differs from the target's token at
    the same position, then the target's token there.

    ``targets[i][j]`` is the target's token after position ``j`` of row ``i`` (its last token
    at ``j = 0``, draft ``j - 1`` after it); a row needs ``len(drafts[i]) + 1`` of them."""
    if len(targets) != len(drafts):
        raise ValueError(f"{len(targets)} target rows for {len(drafts)} draft lists")
    out = []
    for i, (target, row_drafts) in enumerate(zip(targets, drafts, strict=True)):
        if len(target) <= len(row_drafts):
            raise ValueError(f"row {i} has {len(row_drafts)} drafts but only {len(target)} target tokens")
        kept = 0
        while kept < len(row_drafts) and int(row_drafts[kept]) == int(target[kept]):
            kept += 1
        out.append([int(t) for t in row_drafts[:kept]] + [int(target[kept])])
    return out
