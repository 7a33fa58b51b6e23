"""What each distribution's wheel ships: its runtime package, and no test scaffolding.

The simulators and fault injectors the tests and benchmarks share live in ``testing/`` (never
packaged); a wheel built from ``packages/*`` must not carry them, nor any test file. The host
emulator (emulated device, fault-injector loading, host reference models, synthetic weights,
tiny-model recipes and their corpus) ships in the vllm-tt-host wheel only: a production install
of the four product wheels holds none of it.
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
    "tt-host": "vllm_tt_host",
}
PRODUCT = ("tt-platform", "tt-scheduler", "tt-sampling", "tt-models-registry")
TEST_SUPPORT_NAMES = ("RandomFaults", "ScriptedFaults", "DeviceFault", "FakeRunner", "SimConfig", "build_scheduler")
"""Classes and functions of the test-support package; no shipped module may define them."""
EMULATOR_NAMES = ("HostMeshDevice", "HostMeshBackend", "CommandQueue", "load_faults", "HOST_MODELS", "SyntheticLM",
                  "TinyRecipe", "build_tiny_checkpoint")
"""The host emulator's device, backend, fault-injector loading, reference-model table, synthetic
weights and tiny-model recipes/builder: defined in the host wheel, in no product wheel."""
EMULATOR_FILES = ("vllm_tt_host/device.py", "vllm_tt_host/command_queue.py", "vllm_tt_host/backend.py",
                  "vllm_tt_host/fault_loader.py", "vllm_tt_host/tiny.py", "vllm_tt_host/corpus.txt",
                  "vllm_tt_host/models/frame/synthetic.py", "vllm_tt_host/models/families.py")


def defines(source: str, name: str) -> bool:
    return f"class {name}" in source or f"def {name}(" in source or f"\n{name}: " in source or f"\n{name} = " in source


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
        defined = [name for name in TEST_SUPPORT_NAMES if defines(source, name)]
        assert not defined, f"{module} ships test support: {defined}"


def entry_points(wheel: zipfile.ZipFile) -> str:
    return "".join(wheel.read(n).decode() for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))


@pytest.mark.parametrize("dist", PRODUCT)
def test_product_wheel_holds_no_emulator(wheels, dist):
    """No emulator module, corpus or recipe, no definition of one, no import or entry point of it."""
    wheel = wheels[dist]
    names = wheel.namelist()
    assert not [n for n in names if n.startswith("vllm_tt_host/") or n.endswith(("corpus.txt", "/tiny.py"))]
    assert not [n for n in names if "/host/" in n and n.startswith("vllm_tt_platform/")]
    for module in (n for n in names if n.endswith(".py")):
        source = wheel.read(module).decode()
        assert not [name for name in EMULATOR_NAMES if defines(source, name)], module
        assert "import vllm_tt_host" not in source and "from vllm_tt_host" not in source, module
    assert "vllm_tt_host" not in entry_points(wheel) and "vllm-tt-tiny-model" not in entry_points(wheel)


def test_host_wheel_holds_the_emulator_and_registers_it(wheels):
    """The README's serve command trains the embedded tiny model from the corpus the host wheel ships."""
    wheel = wheels["tt-host"]
    names = set(wheel.namelist())
    assert set(EMULATOR_FILES) <= names
    sources = "".join(wheel.read(n).decode() for n in names if n.endswith(".py"))
    assert all(defines(sources, name) for name in EMULATOR_NAMES)
    registered = entry_points(wheel)
    for line in ("host = vllm_tt_host.backend:HostMeshBackend", "host = vllm_tt_host.models:HOST_SOURCE",
                 "vllm-tt-tiny-model = vllm_tt_host.tiny:main"):
        assert line in registered


def test_platform_wheel_registers_the_ttnn_backend_only(wheels):
    registered = entry_points(wheels["tt-platform"])
    assert "[vllm_tt.mesh_backends]\nttnn = vllm_tt_platform.mesh.ttnn_mesh:TtnnMeshBackend\n" in registered
    assert "vllm_tt.model_sources" not in registered
