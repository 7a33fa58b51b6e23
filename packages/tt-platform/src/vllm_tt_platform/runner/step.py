"""``StepPlan``: what one engine step asks of the model, and the fixed-shape inputs for it.

A step is prefill-only or decode-only (:func:`vllm_tt_scheduler.step_phase` classifies it the
same way the scheduler does); a scheduler output mixing the two raises ``MixedStepError``: it
is a broken invariant, not something to filter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm_tt_scheduler.lanes.shape import BlockNumbering
from vllm_tt_scheduler.phase import Phase, step_phase

from vllm_tt_platform.runner.batch import PersistentBatch, RequestState


@dataclass(frozen=True)
class ScheduledRow:
    state: RequestState
    num_scheduled: int

    @property
    def end(self) -> int:
        """Token count covered once this step's tokens are computed."""
        return self.state.num_computed_tokens + self.num_scheduled

    @property
    def produces_token(self) -> bool:
        """False for an intermediate chunk of a chunked prefill."""
        return self.end >= self.state.num_tokens


@dataclass(frozen=True)
class StepPlan:
    phase: Phase
    rows: list[ScheduledRow]

    @classmethod
    def build(cls, out: SchedulerOutput, batch: PersistentBatch) -> StepPlan:
        """Rows of ``out`` (after ``batch`` applied it); raises ``MixedStepError``."""
        mid_prefill = {s.req_id for s in batch if s.num_computed_tokens < s.num_tokens - 1}
        phase = step_phase(out, mid_prefill)
        rows = [ScheduledRow(batch.requests[req_id], n) for req_id, n in out.num_scheduled_tokens.items()]
        return cls(phase, rows)


def page_table(states: list[RequestState | None], width: int, blocks_per_lane: int) -> torch.Tensor:
    """int32 ``[rows, width]`` block table of lane-local block ids, zero-padded (padding rows
    all zeros). With lanes, the scheduler numbers blocks ``lane * blocks_per_lane + local``."""
    table = torch.zeros((len(states), width), dtype=torch.int32)
    numbering = BlockNumbering(blocks_per_lane)
    for i, state in enumerate(states):
        if state is not None and state.block_ids:
            blocks = torch.tensor(state.block_ids[:width], dtype=torch.int32)
            table[i, : len(blocks)] = numbering.local(blocks)
    return table


@dataclass(frozen=True)
class PrefillInputs:
    tokens: torch.Tensor
    page_table: torch.Tensor
    prompt_lens: np.ndarray
    start_pos: np.ndarray
    empty_slots: list[int]

    @classmethod
    def build(cls, rows: list[ScheduledRow], table_width: int, blocks_per_lane: int) -> PrefillInputs:
        ends = [r.end for r in rows]
        tokens = torch.zeros((len(rows), max(ends)), dtype=torch.int32)
        for i, r in enumerate(rows):
            tokens[i, : r.end] = torch.tensor(r.state.token_ids(r.end), dtype=torch.int32)
        return cls(
            tokens=tokens,
            page_table=page_table([r.state for r in rows], table_width, blocks_per_lane),
            prompt_lens=np.array(ends, dtype=np.int64),
            start_pos=np.array([r.state.num_computed_tokens for r in rows], dtype=np.int64),
            empty_slots=[r.state.slot for r in rows],
        )


@dataclass(frozen=True)
class DecodeInputs:
    tokens: torch.Tensor
    start_pos: torch.Tensor
    page_table: torch.Tensor

    @classmethod
    def build(cls, rows: list[ScheduledRow], num_slots: int, table_width: int, blocks_per_lane: int,
              ) -> DecodeInputs:
        """The full fixed batch: every slot is a row; slots without a decode are padding
        (token 0, position -1, zero block table)."""
        tokens = torch.zeros((num_slots, 1), dtype=torch.int32)
        start_pos = torch.full((num_slots,), -1, dtype=torch.int32)
        by_slot: list[RequestState | None] = [None] * num_slots
        for r in rows:
            slot = r.state.slot
            by_slot[slot] = r.state
            tokens[slot, 0] = r.state.last_token
            start_pos[slot] = r.state.num_computed_tokens
        return cls(tokens, start_pos, page_table(by_slot, table_width, blocks_per_lane))
