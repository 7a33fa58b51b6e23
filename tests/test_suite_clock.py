"""The suite's clock, its dealing order and the workers' thread shares: a small suite run by
pytest itself (pytester), in one process and with two xdist workers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from vllm_tt_testing.suite_order import deal_order, unit_of
from vllm_tt_testing.worker_threads import threads_per_worker

pytest_plugins = ["pytester"]

TESTING = Path(__file__).resolve().parents[1] / "testing"

MODULES = {
    "test_engine": """
        import time
        import pytest
        from vllm_tt_testing.suite_clock import engine_started

        @pytest.fixture(scope="module")
        def engine():
            engine_started("serve")
            time.sleep(0.3)
            return "url"

        def test_one(engine):
            assert engine

        def test_two(engine):
            engine_started("llm")
        """,
    "test_plain": """
        def test_fast():
            pass
        """,
    "test_other": """
        def test_a():
            pass

        def test_b():
            pass
        """,
}


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTING), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(**MODULES)
    return pytester


def _run(suite: pytest.Pytester, *args: str) -> tuple[pytest.RunResult, dict]:
    result = suite.runpytest_subprocess("-p", "vllm_tt_testing.suite_clock", "-p", "vllm_tt_testing.suite_order",
                                        "--suite-times", "times", *args)
    result.assert_outcomes(passed=5)
    return result, json.loads((suite.path / "times.json").read_text())


def test_clock_charges_time_and_engine_starts_to_each_module(suite):
    result, table = _run(suite)
    by_module = {m["module"]: m for m in table["modules"]}
    engine = by_module["test_engine.py"]
    assert engine["tests"] == 2 and engine["engines"] == {"serve": 1, "llm": 1} and engine["engine_starts"] == 2
    assert engine["setup"] >= 0.3 and engine["seconds"] >= engine["setup"]
    assert by_module["test_plain.py"]["engine_starts"] == 0
    assert table["modules"][0]["module"] == "test_engine.py"  # slowest first
    assert "| test_engine.py |" in (suite.path / "times.md").read_text()
    result.stdout.fnmatch_lines(["suite clock: 5 tests in 3 modules, * 2 engine starts; slowest: test_engine.py *"])


def test_workers_report_to_the_clock_and_a_module_stays_on_one_worker(suite):
    result, table = _run(suite, "-n", "2", "--dist", "loadscope", "-v")
    assert {m["module"]: m["engine_starts"] for m in table["modules"]}["test_engine.py"] == 2
    workers: dict[str, set[str]] = {}
    for line in result.stdout.lines:  # "[gw0] [ 20%] PASSED test_engine.py::test_one"
        if "PASSED" in line and line.startswith("[gw"):
            workers.setdefault(line.split()[-1].split("::")[0], set()).add(line.split()[0])
    assert all(len(w) == 1 for w in workers.values()), workers


def test_units_are_dealt_longest_first_by_the_committed_table(suite):
    table = suite.path / "benchmarks" / "results"
    table.mkdir(parents=True)
    (table / "suite_times.json").write_text(json.dumps({"wall_s": 1, "modules": [
        {"module": "test_plain.py", "seconds": 500.0}, {"module": "test_engine.py", "seconds": 1.0}]}))
    result, _ = _run(suite, "-n", "1", "--dist", "loadscope", "-v")
    order = [line.split()[-1].split("::")[0] for line in result.stdout.lines
             if "PASSED" in line and line.startswith("[gw")]
    # test_plain (500 s) first, test_other (unknown: 30 s) next, test_engine (1 s) last.
    assert order == ["test_plain.py", "test_other.py", "test_other.py", "test_engine.py", "test_engine.py"], order


def test_modules_sharing_an_engine_are_one_unit():
    shared = {"llama-serve": ("tests/e2e/test_a.py", "tests/e2e/test_b.py")}
    assert unit_of("tests/e2e/test_a.py::test_x", shared) == unit_of("tests/e2e/test_b.py::test_y[1]", shared)
    assert unit_of("tests/e2e/test_c.py::test_z", shared) == "tests/e2e/test_c.py"
    assert deal_order(["a.py::t1", "b.py::t1", "a.py::t2"], {"a.py": 1.0, "b.py": 2.0}) == [1, 0, 2]


THREADS_MODULE = """
    import os
    from pathlib import Path

    import torch

    def test_threads():
        import numba

        Path("threads.txt").write_text(f"{os.environ.get('OMP_NUM_THREADS')} {torch.get_num_threads()}")
        Path("numba.txt").write_text(str(numba.config.NUMBA_NUM_THREADS))
    """


@pytest.mark.parametrize("user", [None, "3"])
def test_each_worker_gets_its_share_of_the_cores_unless_the_user_chose_and_numba_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, user: str | None
):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTING), os.environ.get("PYTHONPATH", "")]))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):  # this run's own worker set them
        monkeypatch.delenv(name, raising=False)
    if user:
        monkeypatch.setenv("OMP_NUM_THREADS", user)
    pytester.makepyfile(test_threads=THREADS_MODULE)
    result = pytester.runpytest_subprocess("-p", "vllm_tt_testing.worker_threads", "-n", "2")
    result.assert_outcomes(passed=1)
    env, torch_threads = (pytester.path / "threads.txt").read_text().split()
    if user:
        assert env == user  # torch itself caps the pool at the cores there are
    else:
        share = str(threads_per_worker(os.cpu_count() or 1, 2))
        assert (env, torch_threads) == (share, share)
    assert (pytester.path / "numba.txt").read_text() == "1"  # vLLM's n-gram proposer uses one


def test_a_worker_gets_its_share_of_the_cores_and_never_none():
    assert threads_per_worker(2, 2) == 1
    assert threads_per_worker(8, 3) == 2
    assert threads_per_worker(1, 4) == 1
