"""What a drafter that reads the target's kept hidden states is called with, checked, and the
hidden states it reads, kept per slot by the target's steps: what ``mtp_forward`` and
``eagle3_forward`` share.

Row ``r``'s ``tokens[r, :n]`` (``n = num_valid_tokens[r]``, 0: padding) are the tokens at
positions ``start_pos[r] + 1 .. start_pos[r] + n``, each read with the target's hidden state one
position before it; the drafter then chains ``num_drafts - 1`` further positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vllm_tt_host.models.frame.inputs import check_decode, check_kv
from vllm_tt_host.models.frame.shapes import HostModelInputError

if TYPE_CHECKING:
    from vllm_tt_host.models.frame.generator import HostCausalLM


class RetainedHidden:
    """The target's final hidden states per slot, from the positions its steps computed and
    its MTP module has not read yet (device memory on hardware)."""

    def __init__(self) -> None:
        self._rows: dict[int, tuple[int, torch.Tensor]] = {}

    def prefilled(self, slot: int, start: int, hidden: torch.Tensor) -> None:
        """A prefill (chunk): the next chunk of the row in the slot, else a new row."""
        first, kept = self._rows.get(slot, (start, hidden[:0]))
        if first + kept.shape[0] != start:
            first, kept = start, hidden[:0]
        self._rows[slot] = (first, torch.cat((kept, hidden)))

    def decoded(self, slot: int, position: int, hidden: torch.Tensor) -> None:
        """A decode or verify position: it replaces what the slot kept from ``position`` on
        (positions whose drafts were rejected are computed again)."""
        first, kept = self._rows.get(slot, (position, hidden[:0]))
        if not first <= position <= first + kept.shape[0]:
            first, kept = position, hidden[:0]
        self._rows[slot] = (first, torch.cat((kept[: position - first], hidden[None])))

    def take(self, slot: int, start: int, count: int) -> tuple[int, torch.Tensor]:
        """The kept hidden states of positions ``[start, start + count)`` from the first one
        kept (``(offset, [m, hidden])``: ``m`` may be short of ``count - offset`` when a row's
        prefix came from the prefix cache); the slot keeps only what follows them."""
        first, kept = self._rows.get(slot, (start, torch.zeros(0)))
        lo, hi = max(start, first), start + count
        taken = kept[lo - first : max(hi - first, 0)]
        self._rows[slot] = (max(hi, first), kept[max(hi - first, 0) :])
        return lo - start, taken


@dataclass(frozen=True)
class DraftCall:
    """One checked drafting call over the full fixed batch."""

    tokens: torch.Tensor
    """``[rows, W]`` long."""
    start: torch.Tensor
    """``[rows]``: the position of the hidden state each row's first token is read with."""
    valid: torch.Tensor
    """``[rows]``: real tokens per row (0: padding)."""
    table: torch.Tensor
    num_drafts: int

    @classmethod
    def check(cls, model: HostCausalLM, name: str, tokens: Any, start_pos: Any, num_valid_tokens: Any,
              page_table: Any, kv_cache: Any, num_drafts: int) -> DraftCall:
        """The call's inputs, refused (naming ``name``) when their shapes disagree or a row's
        last draft position would fall outside its pages."""
        tokens = torch.as_tensor(tokens).long()
        start = torch.as_tensor(start_pos).reshape(-1).long()
        valid = torch.as_tensor(num_valid_tokens).reshape(-1).long()
        if tokens.dim() != 2 or valid.shape != start.shape or tokens.shape[0] != start.shape[0]:
            raise HostModelInputError(
                f"{name} takes tokens [rows, W] with one start_pos and num_valid_tokens per row; got "
                f"{tuple(tokens.shape)}, {tuple(start.shape)}, {tuple(valid.shape)}"
            )
        if num_drafts < 1 or bool((valid < 0).any()) or bool((valid > tokens.shape[1]).any()):
            raise HostModelInputError(f"{name}: num_drafts {num_drafts} < 1 or num_valid_tokens "
                                      f"{valid.tolist()} outside [0, {tokens.shape[1]}]")
        check_kv(kv_cache, model.lanes)
        table = torch.as_tensor(page_table)
        check_decode(tokens[:, 0], cls.last_positions(start, valid, num_drafts), [table], kv_cache, model.lanes,
                     model.max_seq_len)
        return cls(tokens, start, valid, table, num_drafts)

    @staticmethod
    def last_positions(start: torch.Tensor, valid: torch.Tensor, num_drafts: int) -> torch.Tensor:
        """Each row's last position the drafter writes (-1: padding)."""
        return torch.where(valid > 0, start + valid - 1 + num_drafts - 1, -1)

    def duration_s(self, model: HostCausalLM, costs: Any) -> float:
        """Modelled device time: the catch-up as one verify-shaped pass, then one pass per draft."""
        live = torch.where(self.valid > 0, self.start, -1)
        duration = model.lanes.verify_s(costs, live, self.valid)
        return duration + (self.num_drafts - 1) * model.lanes.decode_s(costs, self.last_positions(
            self.start, self.valid, self.num_drafts))

    def kept_hidden(self, retained: RetainedHidden, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(hidden [rows, W, width], first [rows], valid [rows])``: the target's kept hidden
        states for each row's tokens, the offset of the first one kept (a prefix-cached row's
        start was never computed) and the rows' valid counts, 0 for a row whose states the
        target never computed (it drafts nothing)."""
        rows = self.tokens.shape[0]
        valid = self.valid.clone()
        hidden = torch.zeros(rows, self.tokens.shape[1], width)
        first = torch.zeros(rows, dtype=torch.long)
        for r in (valid > 0).nonzero().flatten().tolist():
            offset, kept = retained.take(r, int(self.start[r]), int(valid[r]))
            if kept.shape[0] < int(valid[r]) - offset:
                valid[r] = 0
                continue
            hidden[r, offset : offset + kept.shape[0]] = kept
            first[r] = offset
        return hidden, first, valid
