"""``StepPlan``: what one engine step asks of the model, and the fixed-shape inputs for each
kind of step (prefill, decode, verify, mixed).

A step is prefill-only or decode-only (:func:`vllm_tt_scheduler.step_phase` classifies it the
same way the scheduler does), or, for a model running mixed steps, decode rows and one prompt
chunk; any other scheduler output mixing the two raises ``MixedStepError``: it is a broken
invariant, not something to filter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from vllm.v1.core.sched.output import SchedulerOutput
from vllm_tt_scheduler.lanes.shape import BlockNumbering
from vllm_tt_scheduler.phase import Phase, leaves_prefill_pending, prefill_rows, step_phase

from vllm_tt_platform.runner.batch import PersistentBatch, RequestState
from vllm_tt_platform.runner.kv_layout import KVGroup, KVLayout


@dataclass(frozen=True)
class ScheduledRow:
    state: RequestState
    num_scheduled: int
    """The row's own tokens in this step: vLLM's count less the drafts it scheduled for the row."""

    @property
    def end(self) -> int:
        """Token count covered once this step's tokens are computed."""
        return self.state.num_computed_tokens + self.num_scheduled

    @property
    def produces_token(self) -> bool:
        """False for an intermediate chunk of a chunked prefill."""
        return not leaves_prefill_pending(self.end, self.state.num_tokens)


@dataclass(frozen=True)
class StepPlan:
    phase: Phase
    rows: list[ScheduledRow]
    chunk: ScheduledRow | None = None
    """A mixed step's prompt chunk (one of ``rows``; the others are its decode rows)."""

    @classmethod
    def build(cls, out: SchedulerOutput, batch: PersistentBatch, mixed: bool = False) -> StepPlan:
        """Rows of ``out`` (after ``batch`` applied it); raises ``MixedStepError`` (``mixed``:
        the model runs mixed steps).

        Classifies with each row's record from its previous chunk, then records this chunk's
        (``RequestState.mid_prefill``) for the next step."""
        mid_prefill = {s.req_id for s in batch if s.mid_prefill}
        phase = step_phase(out, mid_prefill, mixed)
        # vLLM counts a row's drafts (or placeholders) among its scheduled tokens; they are not the
        # row's tokens: a verify step carries them apart, and a prefill row (one resumed after
        # preemption onto its cached prefix, say) computes none of its placeholders.
        drafts = out.scheduled_spec_decode_tokens
        rows = [ScheduledRow(batch.requests[req_id], n - len(drafts.get(req_id, ())))
                for req_id, n in out.num_scheduled_tokens.items()]
        chunk = None
        if phase is Phase.MIXED:
            (chunk_id,), _ = prefill_rows(out, mid_prefill)
            chunk = next(r for r in rows if r.state.req_id == chunk_id)
        for row in rows:
            row.state.mid_prefill = not row.produces_token
        return cls(phase, rows, chunk)

    @property
    def decode_rows(self) -> list[ScheduledRow]:
        """A mixed step's rows less its chunk (every row of another step)."""
        return [r for r in self.rows if r is not self.chunk]


def page_table(states: list[RequestState | None], width: int, blocks_per_lane: int,
               group: KVGroup | None = None, ends: list[int] | None = None) -> torch.Tensor:
    """int32 ``[rows, width]`` block table of lane-local block ids, zero-padded (padding rows
    all zeros). With lanes, the scheduler numbers blocks ``lane * blocks_per_lane + local``.

    ``group``: that KV cache group's blocks, with the entries its sliding window has left behind
    zeroed (vLLM may have freed and reused them), or a recurrent group's two state blocks
    (``KVGroup.state_blocks``; ``ends``: each row's token count after the step, by default one
    token past its computed ones); without it, the first group's, every entry. A recurrent
    group's row is at least ``1 + state_slots`` wide (its read block and one write per slot)."""
    if group is not None and group.recurrent and not group.state_boundaries:
        width = max(width, 1 + group.state_slots)
    table = torch.zeros((len(states), width), dtype=torch.int32)
    numbering = BlockNumbering(blocks_per_lane)
    index = 0 if group is None else group.index
    for i, state in enumerate(states):
        if state is None or not state.blocks[index]:
            continue
        ids = state.blocks[index][:width]
        if group is not None and group.recurrent:
            start = state.num_computed_tokens
            ids = list(group.state_blocks(state.blocks[index], start, ends[i] if ends else start + 1))
        live = 0 if group is None else min(group.first_live_block(state.num_computed_tokens), len(ids))
        table[i, live : len(ids)] = numbering.local(torch.tensor(ids[live:], dtype=torch.int32))
    return table


def page_tables_per_layer(states: list[RequestState | None], width: int, blocks_per_lane: int,
                          layout: KVLayout, ends: list[int] | None = None) -> list[torch.Tensor]:
    """One table per layer, its KV cache group's (layers of a group share the tensor);
    ``ends`` as ``page_table``'s."""
    tables = [page_table(states, width, blocks_per_lane, group, ends) for group in layout.groups]
    return [tables[layer.group] for layer in layout.layers]


@dataclass(frozen=True)
class PrefillInputs:
    tokens: torch.Tensor
    page_table: torch.Tensor
    prompt_lens: np.ndarray
    start_pos: np.ndarray
    empty_slots: list[int]
    page_tables_per_layer: list[torch.Tensor] | None = None
    """For a model that declared its KV spec: ``[decode_rows, width]`` per layer, rows in call
    order, then zero rows (the fixed warmup shape, so a captured trace can replay)."""
    cross_page_table: torch.Tensor | None = None
    """An encoder-decoder model's cross-attention group table, shaped as the per-layer ones."""

    @classmethod
    def build(cls, rows: list[ScheduledRow], table_width: int, blocks_per_lane: int,
              layout: KVLayout | None = None, decode_rows: int = 0) -> PrefillInputs:
        ends = [r.end for r in rows]
        tokens = torch.zeros((len(rows), max(ends)), dtype=torch.int32)
        for i, r in enumerate(rows):
            tokens[i, : r.end] = torch.tensor(r.state.token_ids(r.end), dtype=torch.int32)
        states: list[RequestState | None] = [r.state for r in rows]
        per_layer = None
        if layout is not None:
            padded = states + [None] * (decode_rows - len(states))
            per_layer = page_tables_per_layer(padded, table_width, blocks_per_lane, layout,
                                              ends + [0] * (decode_rows - len(states)))
        return cls(
            tokens=tokens,
            page_table=page_table(states, table_width, blocks_per_lane,
                                  layout.text_group if layout is not None else None),
            prompt_lens=np.array(ends, dtype=np.int64),
            start_pos=np.array([r.state.num_computed_tokens for r in rows], dtype=np.int64),
            empty_slots=[r.state.slot for r in rows],
            page_tables_per_layer=per_layer,
            cross_page_table=_cross_table(per_layer, layout),
        )


def slot_states(rows: list[ScheduledRow], num_slots: int) -> list[RequestState | None]:
    """The full fixed decode batch by slot: each row's state at its slot, None for padding."""
    by_slot: list[RequestState | None] = [None] * num_slots
    for r in rows:
        by_slot[r.state.slot] = r.state
    return by_slot


@dataclass(frozen=True)
class DecodeInputs:
    tokens: torch.Tensor
    start_pos: torch.Tensor
    page_table: torch.Tensor
    page_tables_per_layer: list[torch.Tensor] | None = None
    """For a model that declared its KV spec: ``[num_slots, width]`` per layer, by slot."""
    cross_page_table: torch.Tensor | None = None
    """An encoder-decoder model's cross-attention group table, by slot."""

    @classmethod
    def build(cls, rows: list[ScheduledRow], num_slots: int, table_width: int, blocks_per_lane: int,
              layout: KVLayout | None = None) -> DecodeInputs:
        """The full fixed batch: every slot is a row; slots without a decode are padding
        (token 0, position -1, zero block tables)."""
        tokens = torch.zeros((num_slots, 1), dtype=torch.int32)
        start_pos = torch.full((num_slots,), -1, dtype=torch.int32)
        for r in rows:
            tokens[r.state.slot, 0] = r.state.last_token
            start_pos[r.state.slot] = r.state.num_computed_tokens
        return cls.of(slot_states(rows, num_slots), tokens, start_pos, table_width, blocks_per_lane, layout)

    @classmethod
    def of(cls, by_slot: list[RequestState | None], tokens: torch.Tensor, start_pos: torch.Tensor, table_width: int,
           blocks_per_lane: int, layout: KVLayout | None = None) -> DecodeInputs:
        """``tokens`` and ``start_pos`` by slot, with the block tables of the states ``by_slot``."""
        if layout is None:
            return cls(tokens, start_pos, page_table(by_slot, table_width, blocks_per_lane))
        per_layer = page_tables_per_layer(by_slot, table_width, blocks_per_lane, layout)
        return cls(tokens, start_pos, per_layer[layout.text_group.layers[0]], per_layer,
                   _cross_table(per_layer, layout))


def _cross_table(per_layer: list[torch.Tensor] | None, layout: KVLayout | None) -> torch.Tensor | None:
    """The cross-attention group's table among ``per_layer`` (None without such a group)."""
    cross = layout.cross_group if layout is not None else None
    return None if per_layer is None or cross is None else per_layer[cross.layers[0]]


@dataclass(frozen=True)
class VerifyInputs:
    """A verify step's inputs (speculative decoding): the decode batch, each row's drafts after
    its last token (the full fixed batch, by slot)."""

    decode: DecodeInputs
    tokens: torch.Tensor
    """int32 ``[num_slots, 1 + K]``: each live row's last token, then its drafts, zero-padded."""
    num_valid: torch.Tensor
    """int32 ``[num_slots]``: real tokens per row (0: padding row)."""

    @classmethod
    def build(cls, decode: DecodeInputs, rows: list[ScheduledRow], drafts: dict[str, list[int]],
              num_tokens: int) -> VerifyInputs:
        num_slots = decode.tokens.shape[0]
        tokens = torch.zeros((num_slots, 1 + num_tokens), dtype=torch.int32)
        tokens[:, 0] = decode.tokens[:, 0]
        valid = torch.zeros(num_slots, dtype=torch.int32)
        for r in rows:
            row_drafts = drafts.get(r.state.req_id, [])
            slot = r.state.slot
            tokens[slot, 1 : 1 + len(row_drafts)] = torch.tensor(row_drafts, dtype=torch.int32)
            valid[slot] = 1 + len(row_drafts)
        return cls(decode, tokens, valid)
