"""What each distribution's wheel ships: its runtime package, and no test scaffolding.

The simulators and fault injectors the tests and benchmarks share live in ``testing/`` (never
packaged); a wheel built from ``packages/*`` must not carry them, nor any test file.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = {
    "tt-platform": "vllm_tt_platform",
    "tt-scheduler": "vllm_tt_scheduler",
    "tt-sampling": "vllm_tt_sampling",
    "tt-models-registry": "vllm_tt_models_registry",
}
TEST_SUPPORT_NAMES = ("RandomFaults", "ScriptedFaults", "FakeRunner", "SimConfig", "build_scheduler")
"""Classes and functions of the test-support package; no shipped module may define them."""


def build_wheel(folder: Path, out: Path) -> Path:
    from hatchling.builders.wheel import WheelBuilder

    return Path(next(iter(WheelBuilder(str(folder)).build(directory=str(out), versions=["standard"]))))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, zipfile.ZipFile]:
    out = tmp_path_factory.mktemp("wheels")
    return {name: zipfile.ZipFile(build_wheel(REPO / "packages" / name, out)) for name in DISTRIBUTIONS}


@pytest.mark.parametrize("dist", list(DISTRIBUTIONS))
def test_wheel_ships_its_package_and_no_test_scaffolding(wheels, dist):
    names = wheels[dist].namelist()
    modules = [n for n in names if n.endswith(".py")]
    print(f"{dist}: {len(names)} files\n  " + "\n  ".join(names))
    package = DISTRIBUTIONS[dist]
    assert modules and all(m.startswith(f"{package}/") for m in modules), modules
    assert not [n for n in names if "/tests/" in n or n.split("/")[-1].startswith("test_")]
    assert not [n for n in names if "vllm_tt_testing" in n]
    for module in modules:
        source = wheels[dist].read(module).decode()
        defined = [name for name in TEST_SUPPORT_NAMES if f"class {name}" in source or f"def {name}(" in source]
        assert not defined, f"{module} ships test support: {defined}"


def test_platform_wheel_keeps_the_demo_model_and_its_corpus(wheels):
    """The README's serve command trains the embedded tiny model from the shipped corpus."""
    names = set(wheels["tt-platform"].namelist())
    assert {"vllm_tt_platform/host/tiny.py", "vllm_tt_platform/host/corpus.txt"} <= names
