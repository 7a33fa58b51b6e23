"""benchmarks/scheduler_bench.py --quick runs and writes the documented result schema
(a smoke test: no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "scheduler_bench.py"


def test_quick_run_writes_json_and_markdown(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("scheduler_bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["scheduler_bench"] = bench  # dataclasses resolve their module
    try:
        spec.loader.exec_module(bench)
        out_json, out_md = tmp_path / "bench.json", tmp_path / "bench.md"
        assert bench.main(["--quick", "--json", str(out_json), "--markdown", str(out_md)]) == 0
    finally:
        del sys.modules["scheduler_bench"]
    result = json.loads(out_json.read_text())
    assert result["schema_version"] == 1 and result["quick"] is True
    assert set(result["host_cost"]) == {"ample", "pressure"}
    for entry in result["host_cost"].values():
        assert entry["ratio_per_step_median"] > 0 and len(entry["ratios_per_step"]) == 1
    rows = result["latency"]
    assert {row["scheduler"] for row in rows} == {"stock", "tt"}
    for row in rows:
        assert row["ttft_steps"] >= 1 and row["itl_steps"] >= 1
        if row["scheduler"] == "tt":
            assert row["mixed_steps"] == 0 and row["ttft_vs_stock"] > 0
            assert row["prefill_burst"] >= 1 and row["prefill_hold"] >= 0
    assert {row["engine"] for row in rows} == {"ample", "pressure", "trace256"}
    timed = result["timed"]
    assert timed["device_model"] == "llama-3.1-8b@N150" and timed["decode_step_s"] > 0
    assert {row["scheduler"] for row in timed["rows"]} == {"stock", "tt"}
    for row in timed["rows"]:
        assert row["ttft_decode_steps"] > 0 and row["itl_decode_steps"] >= 1
        assert (row["ttft_vs_stock"] is None) == (row["scheduler"] == "stock")
    table = out_md.read_text()
    assert "host cost TT/stock per step" in table and "| trace256 |" in table
    assert "On the modelled device clock (llama-3.1-8b@N150" in table
