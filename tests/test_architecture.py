"""The house's arrows: which part may import which, checked on every module's imports.

Module-level imports only follow the arrows; an import inside a function is a lazy edge (taken
only when that path runs, e.g. the host backend opened on demand) and is listed separately.
docs/architecture.md draws the same table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = {
    "vllm_tt_platform": REPO / "packages/tt-platform/src/vllm_tt_platform",
    "vllm_tt_scheduler": REPO / "packages/tt-scheduler/src/vllm_tt_scheduler",
    "vllm_tt_sampling": REPO / "packages/tt-sampling/src/vllm_tt_sampling",
    "vllm_tt_models_registry": REPO / "packages/tt-models-registry/src/vllm_tt_models_registry",
}
SHARED = ("vllm_tt_platform.errors", "vllm_tt_platform.envs", "vllm_tt_platform.faults", "vllm_tt_platform.compat")
"""Leaf modules of the platform every part may use."""
DISTRIBUTIONS = ("vllm_tt_scheduler", "vllm_tt_sampling", "vllm_tt_models_registry")

ALLOWED: dict[str, tuple[str, ...]] = {
    "vllm_tt_sampling": (),
    "vllm_tt_scheduler": (),
    "vllm_tt_models_registry": (),
    "vllm_tt_platform.config": ("vllm_tt_platform.mesh", *DISTRIBUTIONS),
    "vllm_tt_platform.mesh": ("vllm_tt_platform.config.options",),
    "vllm_tt_platform.runner": ("vllm_tt_platform.config", "vllm_tt_platform.mesh", "vllm_tt_platform.metrics",
                                *DISTRIBUTIONS),
    "vllm_tt_platform.metrics": (),
    "vllm_tt_platform.host": ("vllm_tt_platform.mesh", "vllm_tt_sampling"),
    "vllm_tt_platform.platform": ("vllm_tt_platform.config",),
    "vllm_tt_platform.worker": ("vllm_tt_platform.config", "vllm_tt_platform.mesh", "vllm_tt_platform.runner"),
    "vllm_tt_platform.envs": ("vllm_tt_models_registry.envs",),
    "vllm_tt_platform.errors": (),
    "vllm_tt_platform.faults": (),
    "vllm_tt_platform.compat": (),
}
"""Part -> the other parts its module-level imports may reach (itself and SHARED always)."""

LAZY: dict[str, tuple[str, ...]] = {
    "vllm_tt_platform.config": ("vllm_tt_platform.host.device_time",),
    "vllm_tt_platform.mesh": ("vllm_tt_platform.host",),
}
"""Edges taken only inside a function: the host backend, loaded when it is chosen."""


def part_of(module: str) -> str:
    for part in sorted(ALLOWED, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return module


def modules() -> list[tuple[str, Path]]:
    found = []
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found.append((".".join([package, *parts]), path))
    return found


def imports(path: Path) -> tuple[set[str], set[str]]:
    """(module-level, inside-function) imports of our own distributions."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, inside_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = inside_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                names = [f"{child.module}.{a.name}" for a in child.names]
            for name in names:
                if name.split(".")[0] in SOURCES:
                    (lazy if inside_function else top).add(name)
            visit(child, nested)

    visit(tree, False)
    return top, lazy


def _allowed(source: str, target: str, table: dict[str, tuple[str, ...]]) -> bool:
    own = part_of(source)
    if target.startswith(own) or any(target == s or target.startswith(s + ".") for s in SHARED):
        return True
    return any(target == t or target.startswith(t + ".") or t.startswith(target + ".")
               for t in table.get(own, ()))


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_follow_the_arrows(module, path):
    top, lazy = imports(path)
    wrong = sorted(t for t in top if not _allowed(module, t, ALLOWED))
    assert not wrong, f"{module} imports {wrong} at module level; allowed: {ALLOWED.get(part_of(module))}"
    lazy_table = {k: ALLOWED.get(k, ()) + LAZY.get(k, ()) for k in ALLOWED}
    wrong_lazy = sorted(t for t in lazy if not _allowed(module, t, lazy_table))
    assert not wrong_lazy, f"{module} imports {wrong_lazy} lazily; allowed lazily: {LAZY.get(part_of(module))}"


def test_every_module_belongs_to_a_part():
    """A new top-level module of the platform needs its row in ALLOWED (and in the docs)."""
    loose = [m for m, _ in modules() if part_of(m) not in ALLOWED and m != "vllm_tt_platform"]
    assert not loose
