"""The contracts the platform imports from the scheduler: lane keys, block numbering, options.

The platform writes the ``tt`` keys and reads lane-numbered block ids with these definitions,
so each is checked here once, without an engine.
"""

from __future__ import annotations

import pytest
import torch
from vllm_tt_scheduler import (
    CONFIG_KEYS,
    DEFAULT_PREFILL_BURST,
    DEFAULT_PREFILL_HOLD,
    USER_OPTIONS,
    SchedulerOptions,
    record_prefill_trace_lens,
)
from vllm_tt_scheduler.cost import STEP_COST_KEY
from vllm_tt_scheduler.lanes.shape import LANES_KEY, ROWS_PER_LANE_KEY, BlockNumbering, LaneShape
from vllm_tt_scheduler.options import MIXED_SHAPES_KEY, PREFILL_HOLD, PREFILL_TRACE_LENS_KEY


# -- lane shape ---------------------------------------------------------------------------------
def test_recorded_shape_reads_back() -> None:
    tt: dict[str, object] = {"prefill_burst": 3}
    assert LaneShape.from_tt_section(tt) is None and not LaneShape.recorded(tt)
    LaneShape(4, 8).record(tt)
    assert tt == {"prefill_burst": 3, "_lanes": 4, "_rows_per_lane": 8}
    assert (LANES_KEY, ROWS_PER_LANE_KEY) == ("_lanes", "_rows_per_lane")
    assert LaneShape.recorded(tt)
    assert LaneShape.from_tt_section(tt) == LaneShape(4, 8)
    assert LaneShape(4, 8).rows == 32


@pytest.mark.parametrize(
    ("tt", "message"),
    [
        ({"_lanes": 2}, "tt._rows_per_lane=None"),
        ({"_rows_per_lane": 2}, "tt._lanes=None"),
        ({"_lanes": "2", "_rows_per_lane": 2}, "tt._lanes='2'"),  # no int() on raw input
        ({"_lanes": 2.0, "_rows_per_lane": 2}, "tt._lanes=2.0"),
        ({"_lanes": 2, "_rows_per_lane": False}, "tt._rows_per_lane=False"),
        ({"_lanes": 0, "_rows_per_lane": 2}, "tt._lanes=0"),
    ],
)
def test_recorded_shape_is_validated_not_coerced(tt: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LaneShape.from_tt_section(tt)


def test_a_bad_shape_cannot_be_recorded() -> None:
    with pytest.raises(ValueError, match="tt._rows_per_lane=0"):
        LaneShape(2, 0)
    with pytest.raises(ValueError, match="must be a mapping, got list"):
        LaneShape.from_tt_section([("_lanes", 2)])  # type: ignore[arg-type]


# -- block numbering ----------------------------------------------------------------------------
def test_block_numbering_round_trips() -> None:
    numbering = BlockNumbering(blocks_per_lane=10)
    assert numbering.ids(2, [0, 3, 9]) == [20, 23, 29]
    assert numbering.groups(1, ([0, 1], [5])) == ([10, 11], [15])
    group = [4]
    assert numbering.groups(0, (group,))[0] is group  # lane 0: already global
    assert [numbering.lane_of(block) for block in (0, 9, 10, 29)] == [0, 0, 1, 2]
    assert numbering.local(23) == 3
    table = numbering.local(torch.tensor([20, 23, 29, 5], dtype=torch.int32))
    assert table.dtype == torch.int32 and table.tolist() == [0, 3, 9, 5]


# -- options ------------------------------------------------------------------------------------
def test_user_options_declare_what_the_platform_derives_its_fields_from() -> None:
    assert [(s.name, s.kind, s.default, s.minimum) for s in USER_OPTIONS] == [
        ("prefill_burst", int, DEFAULT_PREFILL_BURST, 1),
        ("prefill_hold", float, DEFAULT_PREFILL_HOLD, 0),
        ("block_tokens", int, 0, 0),
        ("itl_slo_ms", float, 0.0, 0),
    ]
    assert all(spec.doc for spec in USER_OPTIONS)
    assert set(CONFIG_KEYS) == {spec.name for spec in USER_OPTIONS} | {PREFILL_TRACE_LENS_KEY, STEP_COST_KEY,
                                                                       MIXED_SHAPES_KEY}
    assert SchedulerOptions() == SchedulerOptions(DEFAULT_PREFILL_BURST, DEFAULT_PREFILL_HOLD, None)


def test_an_integer_hold_reads_as_a_float() -> None:
    value = PREFILL_HOLD.read({"prefill_hold": 1})
    assert value == 1.0 and isinstance(value, float)
    message = r"tt.prefill_hold=nan is invalid: use a number >= 0 \(default 0.35\)"
    with pytest.raises(ValueError, match=message):
        PREFILL_HOLD.read({"prefill_hold": float("nan")})


def test_trace_lens_are_recorded_for_the_scheduler() -> None:
    tt: dict[str, object] = {}
    record_prefill_trace_lens(tt, (128, 1024, 512))
    assert tt == {"_prefill_trace_lens": [128, 1024, 512]}
    assert SchedulerOptions.from_additional_config({"tt": tt}).prefill_chunk_cap == 1024
    with pytest.raises(ValueError, match="positive ints only"):
        record_prefill_trace_lens({}, [128, 0])
