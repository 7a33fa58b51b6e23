"""The multi-host benchmark's report, without starting servers (the run itself is `nox -s bench`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("multi_host_bench", REPO / "benchmarks" / "multi_host_bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_report_compares_two_hosts_with_one(tmp_path: Path) -> None:
    bench = _bench()

    def fake_run(case, root: Path) -> dict[str, Any]:
        one = {"tokens": 100, "wall_s": 10.0, "wall_tokens_per_s": 10.0, "device_s_per_engine": {"0": 5.0},
               "device_tokens_per_s": 20.0}
        two = {"tokens": 100, "wall_s": 8.0, "wall_tokens_per_s": 12.5,
               "device_s_per_engine": {"0": 2.6, "1": 2.4}, "device_tokens_per_s": 100 / 2.6}
        return {"case": bench.asdict(case), "one_host": one, "two_hosts": two,
                "device_speedup": two["device_tokens_per_s"] / 20.0, "wall_speedup": 1.25}

    result = bench.main(["--quick", "--out", str(tmp_path)], run=fake_run)
    assert [r["case"]["concurrent"] for r in result["runs"]] == [32]
    written = json.loads((tmp_path / "multi_host_bench.json").read_text())
    assert written["runs"][0]["device_speedup"] == 100 / 2.6 / 20.0
    table = (tmp_path / "multi_host_bench.md").read_text()
    assert "| dense | **1.92x** | 1.25x |" in table and "| dense | N150 | 1 x 16 | 32 | 2 | 2 of 2 | 100 | 2.60 |" in table


def test_cases_split_the_same_per_host_mesh() -> None:
    cases = _bench().CASES
    assert cases["dense"].dense and cases["dense"].ranks_per_host == 1
    assert cases["lanes"].mesh == "TG" and cases["lanes"].ranks_per_host == 4
