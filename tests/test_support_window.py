"""One support window everywhere: the noxfile's VLLM_VERSIONS, each distribution's declared
vLLM range, the per-version requirement pins, CI's session and the docs agree."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests import tombstone

ROOT = Path(__file__).resolve().parent.parent
PYPROJECTS = sorted(ROOT.glob("packages/*/pyproject.toml"))


def noxfile_window() -> list[str]:
    """``VLLM_VERSIONS`` from noxfile.py, read without importing nox."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "VLLM_VERSIONS" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("noxfile.py defines no VLLM_VERSIONS")


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_window_is_sorted_exact_releases():
    window = noxfile_window()
    assert len(window) >= 1
    assert window == sorted(window, key=Version)
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in window), window


@pytest.mark.parametrize("pyproject", PYPROJECTS, ids=lambda p: p.parent.name)
def test_each_distribution_declares_the_window_and_a_version(pyproject):
    project = tomllib.loads(pyproject.read_text())["project"]
    assert Version(project["version"])
    window = noxfile_window()
    newest = Version(_minor(window[-1]))
    vllm = [Requirement(d) for d in project["dependencies"] if Requirement(d).name == "vllm"]
    assert len(vllm) == 1, f"{pyproject}: declare exactly one vllm requirement"
    expected = {f">={_minor(window[0])}", f"<{newest.major}.{newest.minor + 1}"}
    assert {str(s) for s in vllm[0].specifier} == expected, f"{pyproject}: vllm range"


def test_each_release_has_its_pins():
    for version in noxfile_window():
        lines = (ROOT / "requirements" / f"vllm-{version}.txt").read_text().splitlines()
        pins = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
        assert [str(p.specifier) for p in pins if p.name == "vllm"] == [f"=={version}"]


def test_installed_floor_is_the_window_floor():
    # The editable installs' metadata is what tombstones read.
    assert tombstone.support_floor("vllm-tt-platform") == Version(_minor(noxfile_window()[0]))


def test_ci_runs_the_newest_release_and_the_docs_name_the_window():
    window = noxfile_window()
    assert f'"tests({_minor(window[-1])})"' in (ROOT / "scripts" / "test.sh").read_text()
    for page in ("README.md", "docs/support-policy.md", "docs/install.md"):
        text = (ROOT / page).read_text()
        for version in window:
            assert _minor(version) in text, f"{page} does not mention vLLM {_minor(version)}"
