"""benchmarks/scheduler_bench.py, clock_bench.py and disagg_bench.py --quick run and write the
documented result schemas (smoke tests: no timing is asserted); the disaggregated clock prices
one request's steps and transfers as documented, and co-located engines share arrivals."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@contextmanager
def loaded(name: str) -> Iterator[Any]:
    """The benchmark module ``benchmarks/{name}.py``, loaded by path."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[name] = bench  # dataclasses resolve their module
    try:
        spec.loader.exec_module(bench)
        yield bench
    finally:
        del sys.modules[name]


def run_quick(name: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    out_json, out_md = tmp_path / f"{name}.json", tmp_path / f"{name}.md"
    with loaded(name) as bench:
        assert bench.main(["--quick", "--json", str(out_json), "--markdown", str(out_md)]) == 0
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


def test_disagg_clock_prices_the_prefill_the_kv_transfer_each_way_and_the_recomputed_tail() -> None:
    """One request of 200 prompt tokens and 3 outputs, alone: its first token comes at the end of
    the prefill engine's step plus the store of its 192 whole-block tokens; the decode engine then
    loads them, recomputes the 8-token tail after them and decodes twice over the whole context."""
    with loaded("disagg_bench") as bench:
        Arrival, TraceSpec = bench.Arrival, bench.TraceSpec
        assert [bench.loaded_tokens(n) for n in (1, 64, 65, 128, 129, 200)] == [0, 0, 64, 64, 128, 192]
        cost, spec = bench.StepCost.of("llama-3.1-8b@N150"), TraceSpec(num_requests=1, load=0.8)
        costs = cost.costs
        result = bench.disaggregated(bench.Setup("tt-steps", True), 0.8, spec, [Arrival(0, "r0", 200, 3)], cost)
        first = cost.seconds([(200, 0)], 0, 0) + costs.kv_transfer_s(192)
        tail = cost.seconds([(8, 192)], 0, 0) + costs.kv_transfer_s(192)
        gaps = [tail + costs.decode_s(200), costs.decode_s(201)]
        assert result["ttft_mean_ms"] == pytest.approx(first * 1e3)
        assert result["itl_mean_ms"] == pytest.approx(sum(gaps) / 2 * 1e3)
        prefill, decode = result["engines"]
        assert (prefill["prefill_steps"], prefill["decode_steps"]) == (1, 0)
        assert (decode["prefill_steps"], decode["decode_steps"]) == (1, 2)


def test_colocated_engines_take_arrivals_least_loaded_first() -> None:
    """Four requests arriving together spread two and two over the co-located engines."""
    with loaded("disagg_bench") as bench:
        Arrival, TraceSpec = bench.Arrival, bench.TraceSpec
        cost, spec = bench.StepCost.of("llama-3.1-8b@N150"), TraceSpec(num_requests=4, load=0.8)
        trace = [Arrival(0, f"r{i}", 100, 4) for i in range(4)]
        result = bench.colocated(bench.Setup("tt-steps"), 0.8, spec, trace, cost)
        assert [engine["requests"] for engine in result["engines"]] == [2, 2]
