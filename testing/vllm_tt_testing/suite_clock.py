"""The suite's own clock: where a run's minutes go, printed at the end of every run.

Per module: wall time spent in it (setup, call and teardown of its tests, so a module fixture's
engine start counts where it is paid), its test count and how many engines it started
(``engine_started`` is called by the e2e helpers for each ``vllm serve`` tree and ``vllm.LLM``).
``--suite-times PATH`` also writes the table as ``PATH.json`` and ``PATH.md`` (the committed
copy is ``benchmarks/results/suite_times.*``); under pytest-xdist the workers' reports reach
the controller, which keeps the table. Loaded for every run by ``-p`` in pyproject.toml.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

ENGINE_PROPERTY = "engine_start"
"""``user_properties`` key of one engine start, valued by the engine's kind."""

_current: pytest.Item | None = None
"""The item whose setup, call or teardown is running in this process (engines started there
are charged to its module)."""


def engine_started(kind: str) -> None:
    """Charge one engine start (``serve``, ``llm``, ``two-hosts``) to the running test's module."""
    if _current is not None:
        _current.user_properties.append((ENGINE_PROPERTY, kind))


@dataclass
class ModuleTime:
    module: str
    seconds: float = 0.0
    setup: float = 0.0
    """Of ``seconds``, the part in fixture set-up: engine starts, checkpoints, references."""
    tests: int = 0
    engines: dict[str, int] = field(default_factory=dict)

    @property
    def engine_starts(self) -> int:
        return sum(self.engines.values())


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class SuiteClock:
    def __init__(self, out: str | None) -> None:
        self.out = Path(out) if out else None
        self.modules: dict[str, ModuleTime] = {}
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        entry = self.modules.setdefault(module_of(report.nodeid), ModuleTime(module_of(report.nodeid)))
        entry.seconds += report.duration
        if report.when == "setup":
            entry.setup += report.duration
        elif report.when == "teardown":
            entry.tests += 1
            for key, kind in report.user_properties:
                if key == ENGINE_PROPERTY:
                    entry.engines[str(kind)] = entry.engines.get(str(kind), 0) + 1

    def table(self) -> list[ModuleTime]:
        return sorted(self.modules.values(), key=lambda m: -m.seconds)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        rows = self.table()
        if not rows:
            return
        wall = time.monotonic() - self.started
        spent = sum(m.seconds for m in rows)
        engines = sum(m.engine_starts for m in rows)
        slowest = ", ".join(f"{m.module} {m.seconds:.0f} s" for m in rows[:3])
        terminalreporter.write_line(
            f"suite clock: {sum(m.tests for m in rows)} tests in {len(rows)} modules, {wall:.0f} s wall, "
            f"{spent:.0f} s in tests, {engines} engine starts; slowest: {slowest}"
        )
        if self.out is not None:
            self.write(self.out, rows, wall)
            terminalreporter.write_line(f"suite clock: table in {self.out}.json and {self.out}.md")

    @staticmethod
    def write(out: Path, rows: list[ModuleTime], wall: float) -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        data = {"wall_s": round(wall, 1), "modules": [
            {**asdict(m), "seconds": round(m.seconds, 1), "setup": round(m.setup, 1), "engine_starts": m.engine_starts}
            for m in rows]}
        out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
        lines = [f"Suite time table: {wall:.0f} s wall, {sum(m.seconds for m in rows):.0f} s in tests "
                 f"(summed over workers), {sum(m.tests for m in rows)} tests.", "",
                 "| module | seconds | of which set-up | tests | engine starts |", "|---|---:|---:|---:|---:|"]
        for m in rows:
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(m.engines.items()))
            lines.append(f"| {m.module} | {m.seconds:.1f} | {m.setup:.1f} | {m.tests} | {kinds or '-'} |")
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-times", default=None, metavar="PATH",
                     help="write the per-module time table to PATH.json and PATH.md")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    global _current
    _current = item
    try:
        yield
    finally:
        _current = None


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker only tracks the running item: its reports (engine starts ride on their
    # user_properties) reach the controller, which keeps the table.
    if getattr(config, "workerinput", None) is None:
        config.pluginmanager.register(SuiteClock(config.getoption("--suite-times")), "suite-clock")
