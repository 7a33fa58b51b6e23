"""Docs that cannot go stale: measured figures come from committed result tables, and no page
cites a path that exists only on one developer's machine.

A figure is written into a page between ``<!-- generated: NAME -->`` and ``<!-- /generated -->``
(inline or over several lines); ``fill`` renders every such block from ``benchmarks/results``,
and ``scripts/gen_docs.py --check`` fails when a block drifts. Outside those blocks two checks
run over README.md and docs/*.md: machine-local paths (``/work/``, ``/root/``, ``/home/<user>/``,
``/tmp/``, ``/Users/``), and hand-written measurements of the tests: a count of tests
(``657 passed``) anywhere, or a time (``2 min 21 s``, ``~5 min``, ``3,344 s``) on a line that
names a test command or the suite. Budgets and configured lengths are spelt out ("35 minutes")
and are not measurements.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path("benchmarks/results")

BLOCK = re.compile(r"(<!-- generated: ([\w-]+) -->)(.*?)(<!-- /generated -->)", re.S)
LOCAL_PATH = re.compile(r"(?<![\w.~-])/(?:work|root|tmp|Users|home/[\w.-]+)/")
TEST_COUNT = re.compile(r"\b\d[\d,]*\s+(?:tests|passed|failed)\b")
DURATION = re.compile(r"(?<![\w.,-])~?\d[\d,]*(?:\.\d+)?\s?(?:s|min)\b")
TEST_COMMAND = re.compile(r"nox -(?:R -)?s|scripts/test\.sh|pytest|\bsuite\b")


@dataclass(frozen=True)
class Problem:
    """One line a docs check refuses, with what to do instead."""

    path: Path
    line: int
    text: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.why}: {self.text.strip()}"


def pages(root: Path = ROOT) -> list[Path]:
    """The pages the checks read: the README and the docs site's sources."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def _suite(root: Path, table: str) -> str:
    data = json.loads((root / RESULTS / f"{table}.json").read_text())
    tests = sum(m["tests"] for m in data["modules"])
    counted = [m["engine_starts"] for m in data["modules"] if "engine_starts" in m]  # older tables lack it
    starts = f", {sum(counted)} engine starts" if counted else ""
    wall = data["wall_s"]
    return (f"{tests:,} tests in {len(data['modules'])} modules, {wall:,.0f} s wall ({wall / 60:.0f} min)"
            f"{starts} (`{RESULTS}/{table}.md`)")


def _first_hour(root: Path) -> dict[str, Any]:
    return json.loads((root / RESULTS / "first_hour.json").read_text())


def _demo(root: Path) -> str:
    data = _first_hour(root)
    d = data["demo"]
    return (f"the first start from a fresh clone with a warm uv cache {d['first_s']} s (install {d['install_s']} s, "
            f"tiny-model training {d['training_s']} s, `vllm serve` {d['serve_s']} s), a second start {d['second_s']} s, "
            f"on {data['machine']} at {data['commit']}; disk: `.venv` {d['venv_gb']} GB as `du` counts it, of which "
            f"{d['venv_new_mb']} MB new (the rest are hard links into uv's cache, {d['uv_cache_gb']} GB on this machine, "
            f"shared by every environment), `.venv-tools` {d['tools_mb']} MB, the checkpoint {d['checkpoint_mb']} MB. "
            f"A cold uv cache adds downloading vLLM, torch and ttnn (about 9 GB; not measured here) "
            f"(`{RESULTS}/first_hour.json`)")


def _tiers(root: Path) -> str:
    data = _first_hour(root)
    rows = [f"| `{t['command']}` | {t['tests']:,} | {t['seconds']:,.0f} s ({t['seconds'] / 60:.1f} min) | {t['note']} |"
            for t in data["tiers"].values()]
    return "\n".join([f"Measured on {data['tiers_machine']} at {data['tiers_commit']} "
                      f"(`{RESULTS}/first_hour.json`):", "",
                      "| command | tests | wall | conditions |", "|---|---:|---:|---|", *rows])


RENDERERS: dict[str, Callable[[Path], str]] = {
    "suite": lambda root: _suite(root, "suite_times"),
    "suite-serial": lambda root: _suite(root, "suite_times_057f1f9"),
    "demo": _demo,
    "tiers": _tiers,
}
"""Block name -> its text, read from the committed results (relative to the checkout)."""


def fill(text: str, root: Path = ROOT) -> str:
    """``text`` with every generated block rendered again; an unknown block name is an error."""

    def render(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in RENDERERS:
            raise ValueError(f"unknown generated block {name!r}; known: {', '.join(RENDERERS)}")
        body = RENDERERS[name](root)
        inline = "\n" not in match.group(3)
        return f"{match.group(1)}{body if inline else chr(10) + body + chr(10)}{match.group(4)}"

    return BLOCK.sub(render, text)


def _outside_blocks(text: str) -> str:
    """The text with every generated block's body blanked (line numbers kept)."""
    return BLOCK.sub(lambda m: m.group(1) + "\n" * m.group(3).count("\n") + m.group(4), text)


def problems(paths: list[Path]) -> list[Problem]:
    """Every machine-local path and hand-written test figure in ``paths``."""
    found = []
    for path in paths:
        for number, line in enumerate(_outside_blocks(path.read_text()).splitlines(), 1):
            if LOCAL_PATH.search(line):
                found.append(Problem(path, number, line, "a machine-local path (write a path relative to "
                                     "the checkout, ~/..., or a placeholder)"))
            if TEST_COUNT.search(line) or (TEST_COMMAND.search(line) and DURATION.search(line)):
                found.append(Problem(path, number, line, "a hand-written test figure (put it in a "
                                     "<!-- generated: NAME --> block of scripts/doc_figures.py, from benchmarks/results)"))
    return found
