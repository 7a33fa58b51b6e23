"""benchmarks/scheduler_bench.py and clock_bench.py --quick run and write the documented result
schemas (smoke tests: no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def run_quick(name: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[name] = bench  # dataclasses resolve their module
    try:
        spec.loader.exec_module(bench)
        out_json, out_md = tmp_path / f"{name}.json", tmp_path / f"{name}.md"
        assert bench.main(["--quick", "--json", str(out_json), "--markdown", str(out_md)]) == 0
    finally:
        del sys.modules[name]
    return json.loads(out_json.read_text()), out_md.read_text()


def test_quick_run_writes_json_and_markdown(tmp_path: Path) -> None:
    result, table = run_quick("scheduler_bench", tmp_path)
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
    assert "host cost TT/stock per step" in table and "| trace256 |" in table


def test_clock_quick_run_reports_what_users_feel_for_five_schedulers_on_two_meshes(tmp_path: Path) -> None:
    result, table = run_quick("clock_bench", tmp_path)
    assert result["schema_version"] == 1 and result["slo"] == {"ttft_decode_steps": 10.0, "itl_decode_steps": 1.25}
    rows = result["rows"]
    assert {(row["cost_model"], row["scheduler"]) for row in rows} == {
        (model, scheduler) for model in ("llama-3.1-8b@N150", "llama-3.3-70b@TG")
        for scheduler in ("stock", "tt-steps", "tt-cost", "tt-mixed", "tt-mixed-slo")
    }
    for row in rows:
        assert 0 < row["ttft_mean_ms"] <= row["ttft_p99_ms"] and 0 < row["itl_mean_ms"] <= row["itl_p99_ms"]
        assert 0 <= row["goodput"] <= 1 and row["slo_unit_ms"] > 0 and row["host_us_per_step"] > 0
        assert (row["mixed_steps"] == 0) == (row["scheduler"] not in ("stock", "tt-mixed", "tt-mixed-slo"))
        assert (row["ttft_mean_ms_vs_stock"] is None) == (row["scheduler"] == "stock")
    assert {(c["cost_model"], c["scheduler"]) for c in result["targets"]} == {
        (model, scheduler) for model in ("llama-3.1-8b@N150", "llama-3.3-70b@TG")
        for scheduler in ("tt-steps", "tt-cost", "tt-mixed", "tt-mixed-slo")
    }
    # Mixed steps' own targets at the quick run's load 0.9: TTFT and ITL bounds for the plain
    # policy, goodput only for the SLO-aware one.
    assert {(c["scheduler"], tuple(sorted(c))) for c in result["mixed_targets"]} == {
        ("tt-mixed", ("cost_model", "goodput_ok", "itl_ok", "load", "scheduler", "ttft_ok")),
        ("tt-mixed-slo", ("cost_model", "goodput_ok", "load", "scheduler")),
    }
    assert "| tt-mixed-slo |" in table and "Mixed steps' targets" in table
    assert "On the modelled device clock of llama-3.3-70b@TG" in table and "| tt-cost |" in table


def test_disagg_quick_run_compares_one_prefill_and_one_decode_engine_with_two_colocated(tmp_path: Path) -> None:
    result, table = run_quick("disagg_bench", tmp_path)
    assert result["schema_version"] == 1 and result["slo"] == {"ttft_decode_steps": 10.0, "itl_decode_steps": 1.25}
    rows, requests = result["rows"], result["plan"]["num_requests"]
    assert {(row["cost_model"], row["setup"]) for row in rows} == {
        (model, setup) for model in ("llama-3.1-8b@N150", "llama-3.3-70b@TG")
        for setup in ("stock", "tt-steps", "tt-cost", "tt-mixed", "disagg-tt-steps", "disagg-tt-cost", "disagg-tt-mixed")
    }
    for row in rows:
        assert 0 < row["ttft_mean_ms"] <= row["ttft_p99_ms"] and 0 < row["itl_mean_ms"] <= row["itl_p99_ms"]
        assert 0 <= row["goodput"] <= 1
        engines = {engine["role"]: engine for engine in row["engines"]}
        if row["disaggregated"]:
            # Every request is prefilled on one engine and decoded on the other; the prefill engine
            # never decodes; the decode engine recomputes prompt tails in prefill steps, or in mixed
            # steps beside its decodes where the model has them.
            assert set(engines) == {"prefill", "decode"}
            assert engines["prefill"]["requests"] == engines["decode"]["requests"] == requests
            assert engines["prefill"]["prefill_steps"] > 0
            assert engines["prefill"]["decode_steps"] == engines["prefill"]["mixed_steps"] == 0
            decode = engines["decode"]
            assert decode["decode_steps"] > decode["prefill_steps"] + decode["mixed_steps"] > 0
            assert row["goodput_vs_colocated"] is not None and row["goodput_vs_stock"] is not None
        else:
            # The load balancer gives both co-located engines a share of the trace.
            assert set(engines) == {"co-located 0", "co-located 1"}
            assert sum(e["requests"] for e in engines.values()) == requests and min(
                e["requests"] for e in engines.values()) > 0
            assert row["goodput_vs_colocated"] is None
        if row["policy"] in ("tt-steps", "tt-cost"):
            assert all(e["mixed_steps"] == 0 for e in engines.values())
    disaggregated = {"disagg-tt-steps", "disagg-tt-cost", "disagg-tt-mixed"}
    assert {(c["cost_model"], c["setup"]) for c in result["crossover"]} == {
        (model, setup) for model in ("llama-3.1-8b@N150", "llama-3.3-70b@TG") for setup in disaggregated
    }
    assert {t["setup"] for t in result["target"]} == disaggregated
    assert "| disagg-tt-cost |" in table and "Crossover" in table and "Target:" in table
