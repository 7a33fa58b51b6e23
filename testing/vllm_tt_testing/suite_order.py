"""How a parallel run (pytest-xdist, ``--dist loadscope``) deals the suite out to its workers.

A module is one unit of work (its module-scoped engines start once), unless it is listed in
``SHARED_ENGINES`` with the modules it shares a session engine with: one worker then runs them
back to back. Units are dealt longest first, by the durations of the committed time table
(``benchmarks/results/suite_times.json``), so the last unit a worker takes is a short one and the
workers finish together; a module the table does not know yet counts as ``UNKNOWN_S``.

xdist's own ``loadgroup`` cannot do this here: it renames items through ``Item._nodeid``, which
pytest 9.2 no longer reads, so its groups silently fall apart into single tests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vllm_tt_testing.suite_clock import module_of

TABLE = Path("benchmarks/results/suite_times.json")
UNKNOWN_S = 30.0
SHARED_ENGINES: dict[str, tuple[str, ...]] = {}
"""Group name -> the modules (paths from the repository root) that share one session engine."""


def unit_of(nodeid: str, shared: dict[str, tuple[str, ...]] = SHARED_ENGINES) -> str:
    module = module_of(nodeid)
    return next((group for group, members in shared.items() if module in members), module)


def expected_seconds(root: Path) -> dict[str, float]:
    path = root / TABLE
    if not path.is_file():
        return {}
    return {m["module"]: float(m["seconds"]) for m in json.loads(path.read_text())["modules"]}


def deal_order(nodeids: list[str], seconds: dict[str, float]) -> list[int]:
    """Indexes of ``nodeids`` with the units longest first, each unit's tests in their order."""
    unit_seconds: dict[str, float] = {}
    seen: set[str] = set()
    for nodeid in nodeids:
        module = module_of(nodeid)
        if module not in seen:
            seen.add(module)
            unit = unit_of(nodeid)
            unit_seconds[unit] = unit_seconds.get(unit, 0.0) + seconds.get(module, UNKNOWN_S)
    return sorted(range(len(nodeids)), key=lambda i: (-unit_seconds[unit_of(nodeids[i])], unit_of(nodeids[i]), i))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config, "workerinput", None) is None:
        return  # a serial run keeps the collection order; the controller collects nothing
    order = deal_order([item.nodeid for item in items], expected_seconds(config.rootpath))
    items[:] = [items[i] for i in order]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class SuiteScheduling(LoadScopeScheduling):
        """Units are modules or shared-engine groups, dealt in the workers' (sorted) order."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False  # keep deal_order's order, not xdist's by test count
    return SuiteScheduling(config, log)
