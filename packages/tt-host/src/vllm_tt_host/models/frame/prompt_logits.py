"""Logits after every computed prefill position, for ``prompt_logprobs``.

A tt-metal prefill returns only the last position's logits. Prompt logprobs need one row per
prompt position, so a host model that declares ``supports_prompt_logprobs`` accepts
``prefill_forward(return_all_logits=True)`` and returns them all. Rows are right-aligned in a
``[B, T, V]`` tensor: ``out[:, -1]`` is still each row's last position, which is all a caller
that only samples reads.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_tt_host.models.frame.decoder import HostDecoder, PrefillInserts
from vllm_tt_host.models.frame.inputs import PrefillRow
from vllm_tt_host.models.frame.paged_kv import LaneKV


def all_position_logits(
    decoder: HostDecoder,
    synthetic: Any,
    tokens: torch.Tensor,
    page_tables: list[torch.Tensor],
    kv_cache: list[LaneKV],
    rows: list[PrefillRow],
    inserts: list[PrefillInserts | None],
) -> torch.Tensor:
    """``[B, T, V]`` with ``T`` the longest computed span; row ``i``'s position
    ``start + j`` sits at ``T - n_i + j`` (``n_i = end - start``), the left padding is zero.

    ``page_tables`` holds one table per layer, ``inserts`` each row's images (or None).
    ``synthetic`` (a ``SyntheticLM`` or None) replaces the decoder math in timing runs."""
    width = max(row.end - row.start for row in rows)
    out = torch.zeros(len(rows), width, decoder.config.vocab_size)
    for i, row in enumerate(rows):
        span = tokens[i, row.start : row.end]
        if synthetic is not None:
            logits = synthetic.logits(span, torch.arange(row.start, row.end))
        else:
            logits = decoder.prefill(span, row.start, row.bucket, [table[i] for table in page_tables],
                                     kv_cache[row.lane], all_positions=True, inserts=inserts[i])
        out[i, width - span.shape[0] :] = logits
    return out
