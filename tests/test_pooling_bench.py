"""The pooling benchmark's quick run writes its documented schema (a smoke test: no timing is
asserted), and its server packs steps with the runner's own planner: batching short prompts
beats serving them alone on the modelled clock, and every prompt's latency is counted."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_tt_testing.bench_module import load_benchmark


def test_quick_run_writes_json_and_markdown(tmp_path: Path) -> None:
    bench = load_benchmark("pooling_bench")
    out_json, out_md = tmp_path / "pooling_bench.json", tmp_path / "pooling_bench.md"
    assert bench.main(["--quick", "--json", str(out_json), "--markdown", str(out_md)]) == 0
    result = json.loads(out_json.read_text())
    assert result["schema_version"] == 1 and result["quick"] is True
    assert {(r["server"], r["shapes"]) for r in result["rows"]} == {("alone", "default"), ("batched", "default")}
    for r in result["rows"]:
        assert r["embeddings_per_s"] > 0 and 0 < r["latency_p50_ms"] <= r["latency_p99_ms"]
        assert 0 <= r["padding_waste"] < 1 and sum(r["calls_per_shape"].values()) >= r["steps"]
    lanes = {r["lanes"]: r for r in result["lanes"]}
    assert set(lanes) == {1, 4} and lanes[1]["throughput_vs_one_engine"] == 1.0
    assert all(r["cost_model"] == "bge-large@TG" and r["embeddings_per_s"] > 0 for r in lanes.values())
    table = out_md.read_text()
    assert "| bge-large@N150 | retrieval (70% queries) | 1 | alone | default |" in table
    assert "| bge-large@TG | retrieval (70% queries) | 1 | 4 |" in table
    assert "Padding waste per captured shape" in table


def test_eight_queued_queries_cost_about_one_weight_stream() -> None:
    from vllm_tt_platform.config.pooling_shapes import PoolingShapes

    bench = load_benchmark("pooling_bench")
    costs = bench.costs_of("bge-large@N150")
    shapes = PoolingShapes.resolve(None, bench.MAX_NUM_SEQS, bench.MAX_MODEL_LEN)
    lengths, times = [20] * 8, [0.0] * 8  # all queued at once
    alone = bench.serve(lengths, times, shapes, costs, alone=True)
    batched = bench.serve(lengths, times, shapes, costs, alone=False)
    assert (alone.steps, batched.steps) == (8, 1)
    assert batched.makespan_s < alone.makespan_s / 4  # weight-bound: one program for all eight
    assert batched.per_shape == {"8x32": 1} and alone.per_shape == {"1x32": 8}
    assert len(batched.latencies) == 8 and max(batched.latencies) == batched.makespan_s


def test_in_lanes_a_step_takes_a_batch_per_lane_in_one_call() -> None:
    """Sixteen queued queries on 2 lanes: one step, one call at 8x32 on both sub-meshes."""
    from vllm_tt_platform.config.pooling_shapes import PoolingShapes

    bench = load_benchmark("pooling_bench")
    shapes = PoolingShapes.resolve(None, bench.MAX_NUM_SEQS, bench.MAX_MODEL_LEN)
    lanes = bench.serve([20] * 16, [0.0] * 16, shapes, bench.costs_of("bge-large@TG", 2), alone=False, lanes=2)
    one = bench.serve([20] * 16, [0.0] * 16, shapes, bench.costs_of("bge-large@TG"), alone=False)
    assert (lanes.steps, lanes.per_shape, lanes.padded_tokens) == (1, {"8x32": 1}, 16 * 32)
    assert (one.steps, one.per_shape) == (2, {"8x32": 2})
