"""``vllm_tt_scheduler.compat``: its shims on the installed vLLM, and their tombstones."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm_tt_scheduler import compat
from vllm_tt_scheduler.carry import carry_over
from vllm_tt_scheduler.scheduler import TTAsyncScheduler, TTScheduler

from tests.tombstone import Tombstone

DIST = "vllm-tt-scheduler"


def test_tombstone_encoder_input_updates():
    Tombstone("vllm_tt_scheduler.compat.encoder_input_updates", DIST, needed_through="0.32").check(
        needed_here=not compat.HAS_ENCODER_INPUT_UPDATES
    )


def test_encoder_input_updates_probe_matches_the_dataclass():
    fields = {f.name for f in dataclasses.fields(SchedulerOutput)}
    assert ("encoder_input_updates" in fields) == compat.HAS_ENCODER_INPUT_UPDATES


def test_carry_over_keeps_drained_fields_on_this_vllm():
    discarded, kept = SchedulerOutput.make_empty(), SchedulerOutput.make_empty()
    discarded.finished_req_ids = {"a"}
    kept.finished_req_ids = {"b"}
    if compat.HAS_ENCODER_INPUT_UPDATES:
        discarded.encoder_input_updates = {"a": {0: None}}
        kept.encoder_input_updates = {"a": {1: None}, "b": {0: None}}
    merged = carry_over(discarded, kept)
    assert merged.finished_req_ids == {"a", "b"}
    expected = {"a": {0: None, 1: None}, "b": {0: None}} if compat.HAS_ENCODER_INPUT_UPDATES else {}
    assert compat.encoder_input_updates(merged) == expected


def test_tombstone_has_request():
    Tombstone("vllm_tt_scheduler.compat.SchedulerBackports.has_request", DIST, needed_through="0.32").check(
        needed_here=not compat.HAS_SCHEDULER_HAS_REQUEST
    )


def test_phase_schedulers_answer_has_request_on_this_vllm():
    assert issubclass(TTScheduler, compat.SchedulerBackports)
    assert issubclass(TTAsyncScheduler, compat.SchedulerBackports)
    holder = object.__new__(TTScheduler)
    holder.requests = {"a": object()}
    assert holder.has_request("a")
    assert not holder.has_request("b")


def test_tombstone_skip_drafts():
    Tombstone("vllm_tt_scheduler.compat.HAS_SKIP_DRAFTS", DIST, needed_through="0.32").check(
        needed_here=not compat.HAS_SKIP_DRAFTS
    )


def test_tombstone_acceptable_drafts():
    Tombstone("vllm_tt_scheduler.compat.grammar_output / acceptable_drafts", DIST, needed_through="0.31").check(
        needed_here=not compat.HAS_ACCEPTABLE_DRAFTS
    )


def test_grammar_output_round_trips_drafts_where_vllm_has_them():
    bitmask = np.zeros((2, 1), dtype=np.int32)
    out = compat.grammar_output(["a", "b"], bitmask, [1, 0])
    assert isinstance(out, GrammarOutput)
    assert out.structured_output_request_ids == ["a", "b"] and out.grammar_bitmask is bitmask
    assert compat.acceptable_drafts(out) == ([1, 0] if compat.HAS_ACCEPTABLE_DRAFTS else None)
    assert compat.acceptable_drafts(compat.grammar_output(["a"], bitmask[:1], None)) is None


def test_vllm_admits_nothing_while_max_num_active_reqs_is_zero():
    """``passes.decode_pass`` closes admission through this limit alone: vLLM's loop over the
    waiting queues must stop before touching them. If a release moves that check, this fails
    (and the decode pass would admit prompts into a decode step)."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm_tt_testing.scheduler_sim import SimConfig, build_scheduler, make_request

    sched = build_scheduler(Scheduler, SimConfig())
    for i in range(3):
        sched.add_request(make_request(f"r{i}", 10, 4))
    sched.max_num_active_reqs = 0
    output = sched.schedule()
    assert output.total_num_scheduled_tokens == 0
    assert [request.request_id for request in sched.waiting] == ["r0", "r1", "r2"]
    assert not sched.running and not sched.kv_holding_waiting


def _items(*spans: tuple[int, int]) -> list[SimpleNamespace]:
    return [SimpleNamespace(mm_position=SimpleNamespace(offset=o, length=n)) for o, n in spans]


def test_whole_mm_items_ends_a_chunk_before_an_image_it_would_cut():
    images = _items((7, 18), (30, 18))
    assert compat.whole_mm_items(images, 0, 40) == 30, "cuts the second image: ends before it"
    assert compat.whole_mm_items(images, 0, 48) == 48, "covers both"
    assert compat.whole_mm_items(images, 0, 20) == 7, "cuts the first"
    assert compat.whole_mm_items(images, 0, 25) == 25, "covers the first, stops before the second"
    assert compat.whole_mm_items(images, 7, 10) == 0, "starts at an image it cannot cover: waits"
    assert compat.whole_mm_items(images, 10, 30) == 20, "starts inside the first (a cache hit): ends before the second"
    assert compat.whole_mm_items(None, 0, 48) == 48


def test_tombstone_whole_mm_items():
    """vLLM 0.33 applies the same rule itself (``<=``: also to a chunk starting at the image),
    before it skips an image scheduled or cached already."""
    from vllm.v1.core.sched.scheduler import Scheduler

    has_rule = "num_computed_tokens <= start_pos" in inspect.getsource(Scheduler._try_schedule_encoder_inputs)
    Tombstone("vllm_tt_scheduler.compat.SchedulerBackports._try_schedule_encoder_inputs", DIST,
              needed_through="0.32").check(needed_here=not has_rule)
