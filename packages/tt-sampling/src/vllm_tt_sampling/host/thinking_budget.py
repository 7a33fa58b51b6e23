"""vLLM's thinking-token budget (``SamplingParams.thinking_token_budget``) over the runner's slots.

vLLM keeps each request's think-section state in a ``ThinkingBudgetStateHolder`` indexed by
persistent-batch row; its ``Sampler`` updates that state from the rows' output tokens and,
once a request has spent its budget inside a think section, forces the reasoning end token
(``--reasoning-parser`` / ``--reasoning-config``). Here the index is the slot, as for the
logits processors (``processors.SlotLogitsProcessors``, which also sends the holder its adds
and removes), so a call that samples only some slots names each row's slot: only those slots'
state advances, and the forcing runs on a slot-indexed copy of the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.sample.thinking_budget_state import ThinkingBudgetStateHolder

RowsOnSlots = Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]
"""Runs a slot-indexed logits edit on one call's rows (``SlotLogitsProcessors.on_slots``)."""


class SlotThinkingBudget(ThinkingBudgetStateHolder):
    def __init__(self, reasoning_config: Any, num_slots: int, rows: Callable[[], torch.Tensor | None],
                 on_slots: RowsOnSlots) -> None:
        """``rows()``: the slot of each row of the current call (None: rows are exactly slots
        0..n-1). No speculative tokens: a step holding a budgeted row verifies no drafts
        (``decision.drafts_blocked_by``)."""
        super().__init__(reasoning_config, num_slots, 0, torch.device("cpu"), is_pin_memory=False)
        self._rows = rows
        self._on_slots = on_slots

    def update_state(self, output_token_ids: list[list[int]], spec_token_ids: list[list[int]] | None,
                     repeat_indices: torch.Tensor | None = None) -> None:
        # vLLM's repeat_indices names the request (here the slot) of each row; slots that do not
        # sample in this call are skipped, so their state does not move.
        super().update_state(output_token_ids, spec_token_ids, repeat_indices=self._rows())

    def apply_to_logits(self, logits: torch.Tensor, predict_bonus_token: bool,
                        spec_token_ids: list[list[int]] | None) -> torch.Tensor:
        def force(wide: torch.Tensor) -> torch.Tensor:
            return super(SlotThinkingBudget, self).apply_to_logits(wide, predict_bonus_token, spec_token_ids)

        return self._on_slots(logits, force)
