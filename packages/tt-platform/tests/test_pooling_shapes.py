"""Pooling shapes: parsing the option, the default grid, and packing a step's prompts into calls."""

from __future__ import annotations

import pytest
from vllm_tt_platform.config.options import TTConfig
from vllm_tt_platform.config.pooling_shapes import PoolCall, PoolingShapes, PoolShape, parse_shapes
from vllm_tt_platform.errors import TTConfigError


def test_parse_sorts_and_dedups() -> None:
    assert parse_shapes("8x128, 1x32,8x128") == (PoolShape(1, 32), PoolShape(8, 128))


@pytest.mark.parametrize("spec", ["8", "8x", "x128", "0x32", "8*128", "8x12.5"])
def test_bad_shape_is_named_in_the_option_error(spec: str) -> None:
    with pytest.raises(TTConfigError, match=r"pooling_shapes.*BATCHxLENGTH"):
        TTConfig.from_sources({"pooling_shapes": spec}, environ={})


def test_default_grid_doubles_up_to_the_limits() -> None:
    shapes = PoolingShapes.resolve(None, max_num_seqs=6, max_model_len=100)
    assert {s.length for s in shapes.shapes} == {32, 64, 96, 100}
    assert {s.batch for s in shapes.shapes} == {1, 2, 4, 6}
    assert shapes.max_length == 100
    # lengths in half octaves from 64 on, whole tiles of 32 (benchmarks/pooling_bench.py)
    lengths = sorted({s.length for s in PoolingShapes.resolve(None, 8, 1024).shapes})
    assert lengths == [32, 64, 96, 128, 192, 256, 384, 512, 768, 1024]


def test_shape_longer_than_max_model_len_is_refused() -> None:
    with pytest.raises(ValueError, match="longer than --max-model-len 64"):
        PoolingShapes.resolve("1x128", max_num_seqs=8, max_model_len=64)


def test_plan_groups_by_length_bucket_and_fills_the_smallest_batch() -> None:
    shapes = PoolingShapes(parse_shapes("1x32,4x32,1x128,2x128"))
    calls = shapes.plan([100, 5, 6, 120, 7, 90])
    assert calls == [
        PoolCall(PoolShape(2, 128), (3, 0)),  # longest first, two per call at 128
        PoolCall(PoolShape(1, 128), (5,)),
        PoolCall(PoolShape(4, 32), (4, 2, 1)),  # three short prompts padded to a batch of 4
    ]


def test_plan_refuses_a_prompt_longer_than_every_shape() -> None:
    with pytest.raises(ValueError, match=r"longest pooling shape \(32\).*pooling_shapes"):
        PoolingShapes(parse_shapes("1x32")).plan([33])


def test_with_a_cost_model_a_group_runs_in_the_calls_that_cost_least() -> None:
    shapes = PoolingShapes(parse_shapes("1x512,2x512,4x512,8x512"))
    # Compute-bound (time grows with every padded row, plus a small fixed cost per program):
    # 3 rows as 2 + 1, 5 as 4 + 1, 7 as 4 + 2 + 1.
    compute = lambda shape: 0.1 + shape.batch  # noqa: E731
    for count, batches in ((3, [2, 1]), (5, [4, 1]), (7, [4, 2, 1]), (8, [8])):
        calls = shapes.plan([500] * count, compute)
        assert [c.shape.batch for c in calls] == batches, count
        assert sorted(r for c in calls for r in c.rows) == list(range(count))
    # Weight-bound (every program costs about one weight stream): 3 rows in one call of 4.
    stream = lambda shape: 1.0 + shape.batch * 0.01  # noqa: E731
    assert [c.shape.batch for c in shapes.plan([500] * 3, stream)] == [4]
    assert [c.shape.batch for c in shapes.plan([500] * 3)] == [4]  # no cost model: fewest calls


def test_in_lanes_a_call_holds_a_shape_on_every_lane() -> None:
    """With 2 lanes a call at 4x32 pools 8 prompts (4 on each sub-mesh) for one sub-mesh's
    time: weight-bound, 5 short prompts run as one call of 4x32; compute-bound, as three calls
    of 1x32 (2 prompts each), where one lane needs 4x32 + 1x32."""
    shapes = PoolingShapes(parse_shapes("1x32,4x32,1x128"))
    stream = lambda shape: 1.0 + shape.batch * 0.01  # noqa: E731
    compute = lambda shape: 0.1 + shape.batch  # noqa: E731
    assert [(c.shape, c.batch) for c in shapes.plan([5, 6, 7, 8, 9], stream, lanes=2)] == [(PoolShape(4, 32), 8)]
    assert [c.batch for c in shapes.plan([5, 6, 7, 8, 9], compute, lanes=2)] == [2, 2, 2]
    assert [c.shape.batch for c in shapes.plan([5, 6, 7, 8, 9], compute)] == [4, 1]
    assert shapes.plan([100, 5], compute, lanes=2)[0] == PoolCall(PoolShape(1, 128), (0,), lanes=2)


def test_in_lanes_a_calls_rows_spread_over_the_lanes() -> None:
    """Row j goes to lane j % lanes: a call of 3 prompts at 4 rows per lane uses both lanes."""
    call = PoolCall(PoolShape(4, 32), (7, 8, 9), lanes=2)
    assert [call.slot(j) for j in range(3)] == [0, 4, 1]
    assert sorted(call.slot(j) for j in range(8)) == list(range(8))
