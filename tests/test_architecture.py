"""The house's arrows: which part may import which, checked on every module's imports.

Module-level and lazy imports (inside a function) follow the same arrows, and the platform's
parts form no cycle. The platform imports nothing of the host emulator (vllm-tt-host): it finds
the host backend and its models through entry points only. docs/architecture.md draws the same
table.
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
    "vllm_tt_host": REPO / "packages/tt-host/src/vllm_tt_host",
}
SHARED = ("vllm_tt_platform.errors", "vllm_tt_platform.envs", "vllm_tt_platform.faults", "vllm_tt_platform.compat")
"""Leaf modules of the platform every part may use."""
DISTRIBUTIONS = ("vllm_tt_scheduler", "vllm_tt_sampling", "vllm_tt_models_registry")

ALLOWED: dict[str, tuple[str, ...]] = {
    "vllm_tt_sampling": (),
    "vllm_tt_scheduler": (),
    "vllm_tt_models_registry": (),
    "vllm_tt_host": ("vllm_tt_platform.config.options", "vllm_tt_platform.cost", "vllm_tt_platform.mesh.shape",
                     "vllm_tt_sampling", "vllm_tt_models_registry"),
    "vllm_tt_platform.config": ("vllm_tt_platform.mesh", "vllm_tt_platform.cost", *DISTRIBUTIONS),
    "vllm_tt_platform.cost": ("vllm_tt_platform.mesh.shape",),
    "vllm_tt_platform.mesh.shape": (),
    "vllm_tt_platform.mesh": ("vllm_tt_platform.mesh.shape",),
    "vllm_tt_platform.runner": ("vllm_tt_platform.config", "vllm_tt_platform.mesh", "vllm_tt_platform.metrics",
                                *DISTRIBUTIONS),
    "vllm_tt_platform.metrics": (),
    "vllm_tt_platform.platform": ("vllm_tt_platform.config",),
    "vllm_tt_platform.worker": ("vllm_tt_platform.config", "vllm_tt_platform.mesh", "vllm_tt_platform.runner"),
    "vllm_tt_platform.envs": ("vllm_tt_models_registry.envs",),
    "vllm_tt_platform.errors": (),
    "vllm_tt_platform.faults": (),
    "vllm_tt_platform.compat": (),
}
"""Part -> the other parts its imports may reach (itself and SHARED always). ``mesh.shape`` (shapes
and presets, the mesh vocabulary) is a part of its own: the cost model and the rest of ``mesh``
both read it."""


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


def _allowed(source: str, target: str) -> bool:
    own = part_of(source)
    if part_of(target) == own or any(target == s or target.startswith(s + ".") for s in SHARED):
        return True
    return any(target == t or target.startswith(t + ".") or t.startswith(target + ".")
               for t in ALLOWED.get(own, ()))


@pytest.mark.parametrize(("module", "path"), modules(), ids=[m for m, _ in modules()])
def test_imports_follow_the_arrows(module, path):
    top, lazy = imports(path)
    wrong = sorted(t for t in top if not _allowed(module, t))
    assert not wrong, f"{module} imports {wrong} at module level; allowed: {ALLOWED.get(part_of(module))}"
    wrong_lazy = sorted(t for t in lazy if not _allowed(module, t))
    assert not wrong_lazy, f"{module} imports {wrong_lazy} lazily; allowed: {ALLOWED.get(part_of(module))}"


def _host_references(path: Path) -> list[str]:
    """Imports of vllm_tt_host (module level or lazy) and ``vllm_tt_host...`` strings (an
    ``import_module`` target or entry-point value) in one source file."""
    top, lazy = imports(path)
    found = sorted(name for name in top | lazy if name.split(".")[0] == "vllm_tt_host")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm_tt_host"):
            found.append(repr(node.value))
    return found


def test_the_platform_imports_nothing_of_the_host_emulator():
    """Every platform module, its imports at module level and inside functions alike: the host
    backend is reached through the vllm_tt.mesh_backends entry point only."""
    wrong = {m: refs for m, path in modules() if m.startswith("vllm_tt_platform") and (refs := _host_references(path))}
    assert not wrong
    assert not [part for part, allowed in ALLOWED.items() if part.startswith("vllm_tt_platform")
                and any(t.startswith("vllm_tt_host") for t in allowed)]


def test_the_platforms_parts_form_no_cycle():
    """No arrow runs back up: config -> mesh and the cost model, the cost model and mesh -> the
    shapes; a cycle between parts (e.g. mesh importing config) fails here with its path."""
    edges: dict[str, set[str]] = {}
    for module, path in modules():
        if not module.startswith("vllm_tt_platform"):
            continue
        top, lazy = imports(path)
        own = part_of(module)
        edges.setdefault(own, set()).update(
            part_of(t) for t in top | lazy if t.startswith("vllm_tt_platform") and part_of(t) not in (own, *SHARED)
        )

    def cycle_from(part: str, trail: tuple[str, ...]) -> tuple[str, ...] | None:
        if part in trail:
            return (*trail[trail.index(part):], part)
        for nxt in sorted(edges.get(part, ())):
            found = cycle_from(nxt, (*trail, part))
            if found:
                return found
        return None

    cycles = [c for part in sorted(edges) if (c := cycle_from(part, ()))]
    assert not cycles, " -> ".join(cycles[0])


def test_every_module_belongs_to_a_part():
    """A new top-level module of the platform needs its row in ALLOWED (and in the docs)."""
    loose = [m for m, _ in modules() if part_of(m) not in ALLOWED and m != "vllm_tt_platform"]
    assert not loose
