"""benchmarks/lanes_bench.py --quick runs and writes its result schema (a smoke test: no timing
is asserted), and the multi-process DP bundle of its end-to-end part is a valid bundle."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "lanes_bench.py"


def load_bench():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("lanes_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["lanes_bench"] = bench  # dataclasses resolve their module
    spec.loader.exec_module(bench)
    return bench


def test_quick_run_writes_json_and_markdown(tmp_path: Path) -> None:
    try:
        bench = load_bench()
        out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
        assert bench.main(["--quick", "--requests", "40", "--json", str(out_json), "--markdown", str(out_md)]) == 0
    finally:
        del sys.modules["lanes_bench"]
    result = json.loads(out_json.read_text())
    assert result["schema_version"] == 1 and result["quick"] is True
    cost = result["host_cost"]
    assert cost["ratio_per_step_median"] > 0 and len(cost["ratios_per_step"]) == 1
    assert cost["meets_target"] == (cost["ratio_per_step_median"] <= cost["target"])
    runs = {run["shape"]: run for run in cost["runs"]}
    assert set(runs) == {"1 x 32 (TTScheduler)", "4 x 8 (TTLaneCoordinator)"}
    assert all(run["decode_steps"] > 0 and run["prefill_steps"] > 0 for run in runs.values())
    share = cost["breakdown"]
    assert 0 < share["coordinator_us_per_step"] < share["host_us_per_step"]
    assert result["end_to_end"]["status"] == "skipped"
    table = out_md.read_text()
    assert "Lanes / single, host cost per step" in table and "| 4 x 8 (TTLaneCoordinator) |" in table


def test_dp_bundle_registers_the_host_llama_without_lanes(tmp_path: Path) -> None:
    from vllm_tt_models_registry import load_registry

    try:
        bench = load_bench()
        bundles = bench.dense_bundle(tmp_path)
    finally:
        del sys.modules["lanes_bench"]
    registry = load_registry("host", environ={"EXTRA_MODELS_DIR": str(bundles)})
    model = registry.resolve("TTLlamaForCausalLM")
    assert model.capabilities().single_program_lanes is False


def test_device_time_from_trace_takes_the_busiest_lane_of_a_prefill_step(tmp_path: Path) -> None:
    def step(phase: str, *lanes: dict[str, int]) -> str:
        return json.dumps({"phase": phase, "lanes": [{"scheduled": lane} for lane in lanes]})

    trace = tmp_path / "steps.jsonl"
    trace.write_text("\n".join([
        step("prefill", {"w": 4}, {}),  # before the measured window
        step("prefill", {"a": 9, "b": 9}, {"c": 9}, {}),  # lanes side by side: lane 0's 2 rows
        step("decode", {"a": 1, "b": 1}, {"c": 1}, {}),
        step("prefill", {"d": 9}, {"e": 9}, {"f": 9}),  # 1 row each, side by side
        json.dumps({"phase": "prefill", "scheduled": {"g": 9, "h": 9}}),  # a DP rank's line: its 2 rows
        json.dumps({"phase": "empty", "scheduled": {}}),
    ]) + "\n")
    try:
        bench = load_bench()
        device = bench.device_time_from_trace(trace, first_step=1)
        assert bench.E2E_DEVICE_TIME == "14ms"
    finally:
        del sys.modules["lanes_bench"]
    row_s = 0.014
    assert (device["prefill_steps"], device["decode_steps"], device["empty_steps"]) == (3, 1, 1)
    assert abs(device["prefill_s"] - 5 * row_s) < 1e-9 and abs(device["device_s"] - 6 * row_s) < 1e-9
