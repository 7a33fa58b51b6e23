"""Docs that cannot go stale (scripts/doc_figures.py): no machine-local paths, no hand-written
test figures, and every generated figure block current. Each check is also shown catching a
bad line planted in a copy of the pages."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("doc_figures", ROOT / "scripts" / "doc_figures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """README, docs/ and the committed results, copied: the planted lines go there."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    return tmp_path


def test_the_pages_have_no_local_paths_or_hand_written_test_figures(figures: ModuleType):
    assert [str(p) for p in figures.problems(figures.pages())] == []


def test_every_generated_figure_is_current(figures: ModuleType):
    stale = [p.name for p in figures.pages() if figures.fill(p.read_text()) != p.read_text()]
    assert stale == [], "run python scripts/gen_docs.py"


@pytest.mark.parametrize("planted", [
    "Run it with `/work/wt-ux/.venv/bin/vllm serve`.",
    "The checkpoint is in /root/.cache/tiny.",
    "see /home/alice/notes.md",
    "`OMP_NUM_THREADS=1 /tmp/t.sh -q tests/e2e/test_serve.py`",
])
def test_a_planted_local_path_is_reported(figures: ModuleType, copy: Path, planted: str):
    page = copy / "docs" / "serving.md"
    page.write_text(page.read_text() + f"\n{planted}\n")
    found = figures.problems(figures.pages(copy))
    assert [(p.path, p.line, "machine-local path" in p.why) for p in found] == [
        (page, len(page.read_text().splitlines()), True)]


@pytest.mark.parametrize("planted", [
    "`nox -s unit`: 657 passed in 2 min 21 s.",
    "The whole suite takes 3,344 s here.",
    "`pytest tests/e2e/test_sampling_serve.py`   # ~5 min",
])
def test_a_planted_hand_written_test_figure_is_reported(figures: ModuleType, copy: Path, planted: str):
    page = copy / "README.md"
    page.write_text(page.read_text() + f"\n{planted}\n")
    found = figures.problems(figures.pages(copy))
    assert [(p.path, p.line, "hand-written test figure" in p.why) for p in found] == [
        (page, len(page.read_text().splitlines()), True)]


def test_figures_inside_a_generated_block_are_not_hand_written(figures: ModuleType, copy: Path):
    page = copy / "README.md"
    page.write_text(page.read_text() + "\nThe suite: <!-- generated: suite -->1,305 tests in 2 min<!-- /generated -->\n")
    assert figures.problems(figures.pages(copy)) == []


def test_a_stale_generated_figure_is_caught(figures: ModuleType, copy: Path):
    page = copy / "docs" / "support-policy.md"
    text = page.read_text()
    assert "<!-- generated: suite -->" in text
    assert figures.fill(text, copy) == text
    suite = copy / "benchmarks" / "results" / "suite_times.json"
    suite.write_text(suite.read_text().replace('"wall_s": ', '"wall_s": 1', 1))  # a new run's table
    assert figures.fill(text, copy) != text
