"""``StepCalls``: the one place a step's device call is built, from the step's plan, its
sampling decision, the KV cache and its page tables, and the rows' multimodal inputs.

The decode step's overlap state (``reset_batch``) and the verify step's drafts come in as
values: the objects that own them decide, the builder only places them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm_tt_sampling.decision import SamplingDecision, SamplingPath
from vllm_tt_scheduler.phase import Phase

from vllm_tt_platform.runner import mm_inputs
from vllm_tt_platform.runner.batch import RequestState
from vllm_tt_platform.runner.calls import BlockCall, DecodeCall, DraftCall, MixedCall, PrefillCall, VerifyCall
from vllm_tt_platform.runner.kv_layout import KVLayout
from vllm_tt_platform.runner.sampling.inputs import DeviceSampling
from vllm_tt_platform.runner.step import DecodeInputs, PrefillInputs, StepPlan, VerifyInputs, slot_states


@dataclass(frozen=True)
class StepCalls:
    """What every call over the current KV cache shares. The runner makes one per step (its
    table width follows ``update_max_model_len``)."""

    kv_cache: Any
    table_width: int
    blocks_per_lane: int
    layout: KVLayout | None
    """Set for a model that declared its KV spec: per-layer page tables."""
    num_slots: int
    vocab_size: int
    prefill_trace: bool
    decode_trace: bool
    uses_mrope: bool
    """Decode calls carry every slot's mRoPE delta."""

    def sampling(self, plan: StepPlan, decision: SamplingDecision) -> DeviceSampling | None:
        """What a device-sampled step is sent, one wire row per call row (prefill: call order;
        decode and verify: by slot, padding slots neutral); None when the host samples."""
        if decision.path is not SamplingPath.DEVICE:
            return None
        if plan.phase is Phase.DECODE:
            return DeviceSampling.of(slot_states(plan.rows, self.num_slots), self.vocab_size)
        return DeviceSampling.of([r.state for r in plan.rows], self.vocab_size)

    def prefill(self, plan: StepPlan, sampling: DeviceSampling | None, *, prompt_logprobs: bool) -> PrefillCall:
        """``prompt_logprobs``: a row collects prompt logprobs; a host-sampled call then returns
        every position's logits."""
        inputs = PrefillInputs.build(plan.rows, self.table_width, self.blocks_per_lane, self.layout, self.num_slots)
        return PrefillCall(
            inputs, self.kv_cache, self.prefill_trace, sampling,
            return_all_logits=sampling is None and prompt_logprobs,
            images=mm_inputs.prefill_image_kwargs([r.state for r in plan.rows]),
        )

    def decode(self, plan: StepPlan, sampling: DeviceSampling | None, *, reset_batch: bool | None) -> DecodeCall:
        return DecodeCall(self._decode_inputs(plan), self.kv_cache, self.decode_trace, sampling,
                          reset_batch=reset_batch, rope_deltas=self._rope_deltas(plan))

    def verify(self, plan: StepPlan, sampling: DeviceSampling | None, drafts: dict[str, list[int]],
               num_tokens: int) -> VerifyCall:
        """``num_tokens``: K, the drafts a verify trace has room for per row."""
        inputs = VerifyInputs.build(self._decode_inputs(plan), plan.rows, drafts, num_tokens)
        return VerifyCall(inputs, self.kv_cache, self.decode_trace, sampling, drafts, self._rope_deltas(plan))

    def _rope_deltas(self, plan: StepPlan) -> list[int] | None:
        """An mRoPE model's decode and verify steps carry every slot's rope delta."""
        if not self.uses_mrope:
            return None
        return mm_inputs.decode_rope_deltas([r.state for r in plan.rows], self.num_slots)

    def block(self, plan: StepPlan, block_tokens: dict[str, int]) -> BlockCall:
        """``block_tokens``: the most tokens each row (by request id) may commit."""
        limits = torch.zeros(self.num_slots, dtype=torch.int32)
        for r in plan.rows:
            limits[r.state.slot] = block_tokens[r.state.req_id]
        return BlockCall(self._decode_inputs(plan), self.kv_cache, self.decode_trace, limits)

    def drafts(self, rows: list[tuple[RequestState, int]]) -> DraftCall:
        """The model's own drafter over ``(row, drafts asked)`` pairs of rows that just produced a
        token: each row's newest token at its position (``num_tokens - 1``; no KV yet)."""
        tokens = torch.zeros((self.num_slots, 1), dtype=torch.int32)
        start_pos = torch.full((self.num_slots,), -1, dtype=torch.int32)
        counts = torch.zeros(self.num_slots, dtype=torch.int32)
        by_slot: list[RequestState | None] = [None] * self.num_slots
        for state, count in rows:
            tokens[state.slot, 0], start_pos[state.slot], counts[state.slot] = state.last_token, state.num_tokens - 1, count
            by_slot[state.slot] = state
        inputs = DecodeInputs.of(by_slot, tokens, start_pos, self.table_width, self.blocks_per_lane, self.layout)
        return DraftCall(inputs, self.kv_cache, counts)

    def mixed(self, plan: StepPlan) -> MixedCall:
        """A mixed step: its decode rows by slot, its chunk as a one-row prefill."""
        if plan.chunk is None:
            raise ValueError(f"a {plan.phase.value} step has no prompt chunk; only a mixed step is a mixed call")
        decode = DecodeInputs.build(plan.decode_rows, self.num_slots, self.table_width, self.blocks_per_lane,
                                    self.layout)
        chunk = PrefillInputs.build([plan.chunk], self.table_width, self.blocks_per_lane, self.layout, self.num_slots)
        return MixedCall(decode, chunk, plan.chunk.produces_token, self.kv_cache, self.decode_trace)

    def _decode_inputs(self, plan: StepPlan) -> DecodeInputs:
        return DecodeInputs.build(plan.rows, self.num_slots, self.table_width, self.blocks_per_lane, self.layout)
