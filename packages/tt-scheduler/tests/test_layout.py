"""The scheduler's one inner arrow: ``lanes`` builds on the phase scheduler, never the reverse.

``lanes/__init__`` says so; this checks every module's imports (a function-level import counts
too), so a phase-scheduler module reaching into ``lanes`` fails here by name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import vllm_tt_scheduler

PACKAGE = Path(vllm_tt_scheduler.__file__).parent


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_phase_scheduler_never_imports_lanes() -> None:
    modules = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    assert {p.stem for p in modules} >= {"scheduler", "passes", "phase", "policy", "options"}
    wrong = {p.name: sorted(n for n in imported(p) if n.startswith("vllm_tt_scheduler.lanes"))
             for p in modules}
    assert {name: found for name, found in wrong.items() if found} == {}


def test_lane_shape_imports_nothing_but_the_standard_library() -> None:
    # The platform imports it at config time, before any vLLM module is needed.
    own = {n for n in imported(PACKAGE / "lanes" / "shape.py") if n.split(".")[0] in ("vllm", "vllm_tt_scheduler")}
    assert own == set()
