"""The multi-host benchmark's report, without starting servers (the run itself is `nox -s bench`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm_tt_testing.bench_module import load_benchmark


def test_report_compares_two_hosts_with_one(tmp_path: Path) -> None:
    bench = load_benchmark("multi_host_bench")

    def fake_run(case, root: Path) -> dict[str, Any]:
        one = {"tokens": 100, "wall_s": 10.0, "wall_tokens_per_s": 10.0, "device_s_per_engine": {"0": 5.0},
               "device_tokens_per_s": 20.0}
        two = {"tokens": 100, "wall_s": 8.0, "wall_tokens_per_s": 12.5,
               "device_s_per_engine": {"0": 2.6, "1": 2.4}, "device_tokens_per_s": 100 / 2.6,
               "steps_per_engine": {"0": 150.0, "1": 140.0}, "decode_fill_per_engine": {"0": 0.9, "1": 0.8}}
        return {"case": bench.asdict(case), "one_host": one, "two_hosts": two,
                "device_speedup": two["device_tokens_per_s"] / 20.0, "wall_speedup": 1.25}

    result = bench.main(["--quick", "--out", str(tmp_path)], run=fake_run)
    assert [r["case"]["concurrent"] for r in result["runs"]] == [32]
    written = json.loads((tmp_path / "multi_host_bench.json").read_text())
    assert written["runs"][0]["device_speedup"] == 100 / 2.6 / 20.0
    table = (tmp_path / "multi_host_bench.md").read_text()
    assert "| dense | **1.92x** | 1.25x |" in table and "| dense | N150 | 1 x 16 | 32 | 2 | 2 of 2 | 100 | 2.60 | 150 | 90% |" in table
    assert "| dense | N150 | 1 x 16 | 32 | 1 | 1 of 1 | 100 | 5.00 | - | - |" in table  # older results: no counts


def test_one_case_keeps_the_other_cases_last_results(tmp_path: Path) -> None:
    bench = load_benchmark("multi_host_bench")

    def run(case) -> dict[str, Any]:
        host = {"tokens": 1, "wall_s": 1.0, "wall_tokens_per_s": 1.0, "device_s_per_engine": {"0": 1.0},
                "device_tokens_per_s": 1.0}
        return {"case": bench.asdict(case), "one_host": host, "two_hosts": host, "device_speedup": 1.0,
                "wall_speedup": 1.0}

    lanes = run(bench.CASES["lanes"])
    (tmp_path / "multi_host_bench.json").write_text(json.dumps({"runs": [lanes, run(bench.CASES["dense"])]}))
    result = bench.main(["--case", "dense", "--out", str(tmp_path)], run=lambda case, root: run(case))
    assert [r["case"]["name"] for r in result["runs"]] == ["dense", "lanes"] and result["runs"][1] == lanes


def test_cases_split_the_same_per_host_mesh() -> None:
    cases = load_benchmark("multi_host_bench").CASES
    assert cases["dense"].dense and cases["dense"].ranks_per_host == 1
    assert cases["lanes"].mesh == "TG" and cases["lanes"].ranks_per_host == 4


def test_engine_totals_sum_each_engines_series(monkeypatch) -> None:
    bench = load_benchmark("multi_host_bench")
    metrics = "\n".join([
        '# HELP vllm_tt:steps_total Engine steps', 'vllm_tt:steps_total{engine="0",phase="decode"} 30.0',
        'vllm_tt:steps_total{engine="0",phase="prefill"} 4.0', 'vllm_tt:decode_rows_used_total{engine="0"} 240.0',
        'vllm_tt:decode_rows_total{engine="0"} 480.0', 'vllm_tt:device_time_per_step_seconds_sum{engine="0",phase="decode"} 0.42',
        'vllm_tt:device_time_per_step_seconds_count{engine="0",phase="decode"} 30.0', 'vllm:other_total{engine="0"} 9.0',
    ])
    monkeypatch.setattr(bench.httpx, "get", lambda url, timeout: type("R", (), {"text": metrics})())
    assert bench._engine_totals("http://x") == {"0": {"device_s": 0.42, "rows_used": 240.0, "rows": 480.0, "steps": 34.0}}
