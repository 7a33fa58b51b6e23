"""A step's device call, one typed call per kind, turned into the model contract's keyword
arguments only where the model is invoked (``to_contract_kwargs``).

A prefill step is one ``prefill_forward``; a decode step, a verify step of speculative
decoding and a block-output decode step are ``decode_forward`` calls of three kinds; a mixed
step is one ``mixed_forward``. ``call_builder.StepCalls`` builds every call; each kind has its result in ``step_results``. A new
kind (pooling, say) adds its call here, its builder method, its result and its runner method, and
changes none of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm_tt_models_registry.contract import (
    BLOCK_KWARG,
    CROSS_PAGE_TABLE_KWARG,
    ROPE_DELTAS_KWARG,
    VERIFY_KWARG,
)

from vllm_tt_platform.runner.sampling.inputs import DeviceSampling
from vllm_tt_platform.runner.step import DecodeInputs, PrefillInputs, VerifyInputs


@dataclass(frozen=True)
class PrefillCall:
    """``prefill_forward`` over the step's rows, in call order."""

    inputs: PrefillInputs
    kv_cache: Any
    enable_trace: bool
    sampling: DeviceSampling | None
    """Set when the device samples the batch."""
    return_all_logits: bool = False
    """Every position's logits, for rows collecting prompt logprobs (host sampling only)."""
    images: Mapping[str, list[list[Any] | None]] = field(default_factory=dict)
    """The contract's ``IMAGE_KWARGS`` rows (``mm_inputs.prefill_image_kwargs``); empty for a
    text-only step."""

    def to_contract_kwargs(self) -> dict[str, Any]:
        inputs = self.inputs
        kwargs: dict[str, Any] = {
            "tokens": inputs.tokens, "page_table": inputs.page_table, "kv_cache": self.kv_cache,
            "prompt_lens": inputs.prompt_lens, "start_pos": inputs.start_pos, "empty_slots": inputs.empty_slots,
            "enable_trace": self.enable_trace,
        }
        if self.sampling is not None:
            kwargs.update(self.sampling.to_contract_kwargs())
        if self.return_all_logits:
            kwargs["return_all_logits"] = True
        if inputs.page_tables_per_layer is not None:
            kwargs["page_tables_per_layer"] = inputs.page_tables_per_layer
        if inputs.cross_page_table is not None:
            kwargs[CROSS_PAGE_TABLE_KWARG] = inputs.cross_page_table
        kwargs.update(self.images)
        return kwargs


@dataclass(frozen=True)
class DecodeCall:
    """``decode_forward`` of one token per slot over the full fixed batch; the runner reads the
    result back itself (``read_from_device=False``: synchronously, or overlapped)."""

    inputs: DecodeInputs
    kv_cache: Any
    enable_trace: bool
    sampling: DeviceSampling | None
    """Set when the device samples the batch."""
    reset_batch: bool | None = None
    """Device-sampled decodes only: whether the slot layout changed since the last one
    (``async_decode.DecodeOverlap.reset_batch``)."""
    rope_deltas: list[int] | None = None
    """mRoPE models: every slot's position delta (``mm_inputs.decode_rope_deltas``)."""

    def to_contract_kwargs(self) -> dict[str, Any]:
        kwargs = _decode_kwargs(self.inputs, self.inputs.tokens, self.kv_cache, self.enable_trace,
                                read_from_device=False)
        if self.reset_batch is not None:
            kwargs["reset_batch"] = self.reset_batch
        if self.inputs.page_tables_per_layer is not None:
            kwargs["page_tables_per_layer"] = self.inputs.page_tables_per_layer
        if self.inputs.cross_page_table is not None:
            kwargs[CROSS_PAGE_TABLE_KWARG] = self.inputs.cross_page_table
        if self.sampling is not None:
            kwargs.update(self.sampling.to_contract_kwargs())
        if self.rope_deltas is not None:
            kwargs[ROPE_DELTAS_KWARG] = self.rope_deltas
        return kwargs


@dataclass(frozen=True)
class VerifyCall:
    """``decode_forward`` of a verify step: ``[num_slots, 1 + K]`` tokens with the contract's
    ``VERIFY_KWARG``, read back in the call. With ``sampling`` (every row greedy) the device
    verifies and returns argmax tokens; without, it returns every position's logits."""

    inputs: VerifyInputs
    kv_cache: Any
    enable_trace: bool
    sampling: DeviceSampling | None
    drafts: dict[str, list[int]]
    """Each row's drafts, as the acceptance reads them."""
    rope_deltas: list[int] | None = None
    """mRoPE models: every slot's position delta, as a decode step's (a verify position
    ``p + j`` rotates at ``p + j + delta``)."""

    def to_contract_kwargs(self) -> dict[str, Any]:
        decode = self.inputs.decode
        kwargs = _decode_kwargs(decode, self.inputs.tokens, self.kv_cache, self.enable_trace, read_from_device=True)
        kwargs[VERIFY_KWARG] = self.inputs.num_valid
        if self.sampling is not None:
            kwargs.update(self.sampling.to_contract_kwargs())
        if decode.page_tables_per_layer is not None:
            kwargs["page_tables_per_layer"] = decode.page_tables_per_layer
        if self.rope_deltas is not None:
            kwargs[ROPE_DELTAS_KWARG] = self.rope_deltas
        return kwargs


@dataclass(frozen=True)
class BlockCall:
    """``decode_forward`` of a block-output step (adaptive block output): one token per slot in,
    with the contract's ``BLOCK_KWARG``; the model returns up to ``block_tokens[slot]`` committed
    tokens per row, read back in the call."""

    inputs: DecodeInputs
    kv_cache: Any
    enable_trace: bool
    block_tokens: torch.Tensor
    """int32 ``[num_slots]``: the most tokens each row may commit (0: padding)."""

    def to_contract_kwargs(self) -> dict[str, Any]:
        kwargs = _decode_kwargs(self.inputs, self.inputs.tokens, self.kv_cache, self.enable_trace,
                                read_from_device=True)
        kwargs[BLOCK_KWARG] = self.block_tokens
        if self.inputs.page_tables_per_layer is not None:
            kwargs["page_tables_per_layer"] = self.inputs.page_tables_per_layer
        return kwargs


@dataclass(frozen=True)
class DraftCall:
    """``propose_drafts``: the model's own drafter (``max_model_drafts``) after a step, over the
    full fixed batch: each drafting row's newest token at its position, the rest padding."""

    inputs: DecodeInputs
    kv_cache: Any
    num_drafts: torch.Tensor
    """int32 ``[num_slots]``: the drafts each row asks for (0: none, padding)."""

    def to_contract_kwargs(self) -> dict[str, Any]:
        kwargs = {"tokens": self.inputs.tokens, "start_pos": self.inputs.start_pos,
                  "page_table": self.inputs.page_table, "kv_cache": self.kv_cache, "num_drafts": self.num_drafts}
        if self.inputs.page_tables_per_layer is not None:
            kwargs["page_tables_per_layer"] = self.inputs.page_tables_per_layer
        return kwargs


@dataclass(frozen=True)
class MixedCall:
    """``mixed_forward`` of a mixed step: the decode rows as a host-sampled decode over the full
    fixed batch and one prompt chunk as a one-row prefill (the contract's ``MIXED_KWARGS``),
    read back in the call."""

    decode: DecodeInputs
    chunk: PrefillInputs
    """One row: the chunk's tokens, start, page table(s) and slot."""
    chunk_completes: bool
    kv_cache: Any
    enable_trace: bool

    def to_contract_kwargs(self) -> dict[str, Any]:
        decode, chunk = self.decode, self.chunk
        kwargs: dict[str, Any] = {"tokens": decode.tokens, "start_pos": decode.start_pos, "page_table": decode.page_table,
                                  "kv_cache": self.kv_cache, "enable_trace": self.enable_trace}
        kwargs.update(chunk_tokens=chunk.tokens, chunk_start=int(chunk.start_pos[0]), chunk_page_table=chunk.page_table,
                      chunk_slot=chunk.empty_slots[0], chunk_completes=self.chunk_completes)
        if decode.page_tables_per_layer is not None:
            kwargs["page_tables_per_layer"] = decode.page_tables_per_layer
        if chunk.page_tables_per_layer is not None:
            kwargs["chunk_page_tables_per_layer"] = [t[:1] for t in chunk.page_tables_per_layer]
        return kwargs


def _decode_kwargs(inputs: DecodeInputs, tokens: Any, kv_cache: Any, enable_trace: bool, *,
                   read_from_device: bool) -> dict[str, Any]:
    """The arguments every ``decode_forward`` call takes (the contract's ``CALLS`` keywords)."""
    return {"tokens": tokens, "start_pos": inputs.start_pos, "page_table": inputs.page_table,
            "kv_cache": kv_cache, "enable_trace": enable_trace, "read_from_device": read_from_device}
