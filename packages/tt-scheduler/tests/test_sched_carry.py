"""``carry_over``: what a discarded pass drained reaches the runner with the kept one."""

from __future__ import annotations

from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm_tt_scheduler.carry import carry_over
from vllm_tt_scheduler.compat import HAS_ENCODER_INPUT_UPDATES, encoder_input_updates


def output(**fields: object) -> SchedulerOutput:
    base = dict(
        scheduled_new_reqs=[],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={},
        total_num_scheduled_tokens=0,
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[],
        finished_req_ids=set(),
        free_encoder_mm_hashes=[],
    )
    base.update(fields)
    if not HAS_ENCODER_INPUT_UPDATES:  # vLLM < 0.33: no such field, nothing to carry
        base.pop("encoder_input_updates", None)
    return SchedulerOutput(**base)  # type: ignore[arg-type]


def test_drained_fields_are_merged() -> None:
    discarded = output(
        finished_req_ids={"a"},
        preempted_req_ids={"p"},
        free_encoder_mm_hashes=["h1"],
        new_block_ids_to_zero=[3],
        encoder_input_updates={"x": {0: None}},
    )
    kept = output(
        num_scheduled_tokens={"b": 1},
        total_num_scheduled_tokens=1,
        finished_req_ids={"c"},
        free_encoder_mm_hashes=["h2"],
        new_block_ids_to_zero=[4],
        encoder_input_updates={"x": {1: None}},
    )
    merged = carry_over(discarded, kept)
    assert merged is kept
    assert merged.finished_req_ids == {"a", "c"}
    assert merged.preempted_req_ids == {"p"}
    assert merged.free_encoder_mm_hashes == ["h1", "h2"]
    assert merged.new_block_ids_to_zero == [3, 4]
    assert encoder_input_updates(merged) == ({"x": {0: None, 1: None}} if HAS_ENCODER_INPUT_UPDATES else {})
    assert merged.num_scheduled_tokens == {"b": 1}


def test_nothing_drained_leaves_kept_alone() -> None:
    kept = output(finished_req_ids={"c"})
    assert carry_over(output(), kept).finished_req_ids == {"c"}
