"""Merge the lanes' scheduler outputs into the one step the runner executes.

Each lane numbers the blocks of its own KV pool from 0; the runner tells the lanes' KV caches
apart by block id (``shape.BlockNumbering``). Every field that carries block ids is renumbered
here; the lane outputs themselves are left untouched, because each lane's
``update_from_output`` reads its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from functools import cache
from operator import attrgetter
from typing import Any

import numpy as np
from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy
from vllm.v1.core.sched.output import (
    CachedRequestData,
    GrammarOutput,
    NewRequestData,
    ScheduledEncoderInputStats,
    SchedulerOutput,
)

from vllm_tt_scheduler.compat import (
    HAS_ENCODER_INPUT_UPDATES,
    HAS_SKIP_DRAFTS,
    acceptable_drafts,
    grammar_output,
)
from vllm_tt_scheduler.lanes.shape import BlockNumbering

#: SchedulerOutput fields ``merge_outputs`` knows how to merge, across the supported vLLM
#: releases. A release adding a field fails ``test_lanes_merge`` until the field gets a rule here.
MERGED_FIELDS = frozenset({
    "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
    "total_num_scheduled_tokens", "scheduled_spec_decode_tokens", "scheduled_encoder_inputs",
    "finished_req_ids", "free_encoder_mm_hashes", "encoder_input_updates",
    "scheduled_encoder_input_stats", "preempted_req_ids", "has_structured_output_requests",
    "pending_structured_output_tokens", "num_invalid_spec_tokens", "kv_connector_metadata",
    "has_sync_kv_loads", "aux_output_connector_metadata", "ec_connector_metadata",
    "ec_manager_metadata", "new_block_ids_to_zero", "kv_cache_block_copies", "block_table_updates",
    "kv_connector_block_state", "num_spec_tokens_to_schedule", "num_common_prefix_blocks",
    "skip_drafts",
})

# Connector state is per scheduler and cannot be merged; connectors are refused at start
# (``requirements.check_vllm_config``), so a lane producing any is a bug.
_UNMERGEABLE = ("kv_connector_metadata", "aux_output_connector_metadata", "ec_connector_metadata",
                "ec_manager_metadata", "kv_connector_block_state", "block_table_updates")


@cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def known_fields(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` restricted to the fields ``cls`` has in the installed vLLM release."""
    names = _field_names(cls)
    for name in [name for name in values if name not in names]:
        values.pop(name, None)
    return values


_OUTPUT_FIELDS = _field_names(SchedulerOutput)
_UNMERGEABLE_PRESENT = tuple(name for name in _UNMERGEABLE if name in _OUTPUT_FIELDS)
_unmergeable_values = attrgetter(*_UNMERGEABLE_PRESENT)
_NONE = (None,) * len(_UNMERGEABLE_PRESENT)

# What the rest of the fields hold on almost every step (no speculative decoding, encoder
# inputs, grammars, zeroed or copied blocks, connectors). One C-level read per lane tells
# whether a lane needs the rare-field merge at all.
_RARE_DEFAULTS: dict[str, Any] = {
    "scheduled_spec_decode_tokens": {}, "scheduled_encoder_inputs": {}, "free_encoder_mm_hashes": [],
    "encoder_input_updates": {}, "scheduled_encoder_input_stats": None, "num_invalid_spec_tokens": None,
    "new_block_ids_to_zero": None, "kv_cache_block_copies": None, "has_structured_output_requests": False,
    "pending_structured_output_tokens": False, "has_sync_kv_loads": False, "num_spec_tokens_to_schedule": 0,
    **dict.fromkeys(_UNMERGEABLE),
}
_RARE_PRESENT = tuple(name for name in _RARE_DEFAULTS if name in _OUTPUT_FIELDS)
_rare_values = attrgetter(*_RARE_PRESENT)
_RARE_PLAIN = tuple(_RARE_DEFAULTS[name] for name in _RARE_PRESENT)


def merge_outputs(outputs: Sequence[SchedulerOutput | None], numbering: BlockNumbering) -> SchedulerOutput:
    """One ``SchedulerOutput`` for the lanes' outputs (index = lane; None: a lane that ran no
    pass), rows in lane order.

    Runs every engine step: the fields every step carries are merged here, the rest only for
    the lanes whose output sets any of them (``_merge_rare``).
    """
    new_reqs: list[NewRequestData] = []
    cached = CachedRequestData.make_empty()
    num_scheduled: dict[str, int] = {}
    finished: set[str] = set()
    preempted: set[str] | None = None
    total = groups = 0
    skip_drafts = HAS_SKIP_DRAFTS
    present = False
    rare: list[tuple[int, SchedulerOutput]] = []
    for lane, out in enumerate(outputs):
        if out is None:
            continue
        present = True
        groups = len(out.num_common_prefix_blocks)
        if out.scheduled_new_reqs:
            if lane:
                new_reqs += [replace(new, block_ids=numbering.groups(lane, new.block_ids))
                             for new in out.scheduled_new_reqs]
            else:
                new_reqs += out.scheduled_new_reqs
        if out.scheduled_cached_reqs.req_ids:
            _extend_cached(cached, out.scheduled_cached_reqs, lane, numbering)
        num_scheduled.update(out.num_scheduled_tokens)
        total += out.total_num_scheduled_tokens
        if out.finished_req_ids:
            finished |= out.finished_req_ids
        if out.preempted_req_ids is not None:
            preempted = (preempted or set()) | out.preempted_req_ids
        skip_drafts = skip_drafts and out.skip_drafts
        if _rare_values(out) != _RARE_PLAIN:
            rare.append((lane, out))
    merged = SchedulerOutput(
        scheduled_new_reqs=new_reqs,
        scheduled_cached_reqs=cached,
        num_scheduled_tokens=num_scheduled,
        total_num_scheduled_tokens=total,
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        finished_req_ids=finished,
        free_encoder_mm_hashes=[],
        preempted_req_ids=preempted,
        # Blocks shared by every row (cascade attention): none across separate KV pools.
        num_common_prefix_blocks=[0] * groups,
    )
    if HAS_SKIP_DRAFTS:
        merged.skip_drafts = skip_drafts and present
    if rare:
        _merge_rare(merged, rare, numbering)
    return merged


def _merge_rare(merged: SchedulerOutput, lanes: list[tuple[int, SchedulerOutput]], numbering: BlockNumbering) -> None:
    """Merge into ``merged`` the rarely set fields of the lanes' outputs that set any."""
    encoder_stats: ScheduledEncoderInputStats | None = None
    to_zero: list[int] = []
    copies: list[KVCacheBlockCopy] = []
    for lane, out in lanes:
        if _unmergeable_values(out) != _NONE:
            name = next(n for n in _UNMERGEABLE_PRESENT if getattr(out, n) is not None)
            raise RuntimeError(f"lane {lane} set SchedulerOutput.{name}; lanes cannot merge it")
        merged.scheduled_spec_decode_tokens.update(out.scheduled_spec_decode_tokens)
        merged.scheduled_encoder_inputs.update(out.scheduled_encoder_inputs)
        merged.free_encoder_mm_hashes += out.free_encoder_mm_hashes
        if HAS_ENCODER_INPUT_UPDATES:
            merged.encoder_input_updates.update(out.encoder_input_updates)
        if out.num_invalid_spec_tokens is not None:
            merged.num_invalid_spec_tokens = {**(merged.num_invalid_spec_tokens or {}), **out.num_invalid_spec_tokens}
        if out.new_block_ids_to_zero:
            to_zero += numbering.ids(lane, out.new_block_ids_to_zero)
        if out.kv_cache_block_copies:
            offset = lane * numbering.blocks_per_lane
            copies += [KVCacheBlockCopy(copy.src_block_id + offset, copy.dst_block_id + offset)
                       for copy in out.kv_cache_block_copies]
        if out.scheduled_encoder_input_stats is not None:
            stats = out.scheduled_encoder_input_stats
            encoder_stats = encoder_stats or ScheduledEncoderInputStats()
            encoder_stats.num_inputs += stats.num_inputs
            encoder_stats.output_tokens += stats.output_tokens
        merged.has_structured_output_requests |= out.has_structured_output_requests
        merged.pending_structured_output_tokens |= out.pending_structured_output_tokens
        merged.has_sync_kv_loads |= out.has_sync_kv_loads
        merged.num_spec_tokens_to_schedule = max(merged.num_spec_tokens_to_schedule, out.num_spec_tokens_to_schedule)
    merged.scheduled_encoder_input_stats = encoder_stats
    merged.new_block_ids_to_zero = to_zero or None
    merged.kv_cache_block_copies = copies or None


def _extend_cached(merged: CachedRequestData, cached: CachedRequestData, lane: int,
                   numbering: BlockNumbering) -> None:
    merged.req_ids += cached.req_ids
    if cached.resumed_req_ids:
        merged.resumed_req_ids |= cached.resumed_req_ids
    merged.new_token_ids += cached.new_token_ids
    if cached.all_token_ids:
        merged.all_token_ids.update(cached.all_token_ids)
    if lane:
        merged.new_block_ids += [None if ids is None else numbering.groups(lane, ids) for ids in cached.new_block_ids]
    else:
        merged.new_block_ids += cached.new_block_ids
    merged.num_computed_tokens += cached.num_computed_tokens
    merged.num_output_tokens += cached.num_output_tokens


def merge_grammar(outputs: Sequence[GrammarOutput | None]) -> GrammarOutput | None:
    """One bitmask for the lanes' structured-output rows, lanes in order.

    Each lane's bitmask must already be a copy: vLLM returns a view of a buffer shared by
    every scheduler using the same structured-output manager.
    """
    present = [out for out in outputs if out is not None]
    if not present:
        return None
    if len(present) == 1:
        return present[0]
    drafts: list[int] | None = []
    for out in present:
        acceptable = acceptable_drafts(out)
        if acceptable is None or drafts is None:
            drafts = None
        else:
            drafts.extend(acceptable)
    return grammar_output(
        [req_id for out in present for req_id in out.structured_output_request_ids],
        np.concatenate([out.grammar_bitmask for out in present]),
        drafts,
    )
