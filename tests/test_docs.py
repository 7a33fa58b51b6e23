"""The docs site stays true to the code: generated pages are current, the feature matrix's
proofs name real tests, every page is in the site's navigation, and hand-written tables list
what the code has. ``nox -s docs`` also builds the site strictly (mkdocs is not installed here)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def model_pages() -> ModuleType:
    spec = importlib.util.spec_from_file_location("model_pages", ROOT / "scripts" / "model_pages.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_generated_pages_are_current():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_generated_pages_cover_every_registered_family():
    from vllm_tt_host.models import HOST_MODELS
    from vllm_tt_models_registry.builtin import BUILTIN_FAMILIES
    from vllm_tt_models_registry.names import tt_arch_name

    models, features = (DOCS / "models.md").read_text(), (DOCS / "features.md").read_text()
    for arch, target in HOST_MODELS.items():
        assert f"| `{arch}` | `{target}` |" in models, arch
        assert f"| `{arch}` |" in features, arch
    for fam in BUILTIN_FAMILIES:
        for hf_arch in fam.archs:
            assert f"`{tt_arch_name(hf_arch)}`" in models, hf_arch
        assert f"| {fam.name}" in features, fam.name


def test_every_proof_names_a_test_that_builds_its_families(model_pages: ModuleType):
    """(Which families a test parametrized over ``arch`` runs, the generator asks pytest; a
    failing or empty collection fails the generator, so the staleness test above.)"""
    from vllm_tt_host.tiny import ARCHITECTURES

    assert {p.feature for p in model_pages.PROOFS} <= set(model_pages.FEATURES)
    for proof in model_pages.PROOFS:
        source = (ROOT / proof.path).read_text()
        assert re.search(rf"^(async )?def {proof.function}\(", source, re.M), proof.test
        if proof.archs == model_pages.ARCH_PARAM:
            assert f'parametrize("{model_pages.ARCH_PARAM}"' in source, proof.test
        else:
            for arch in proof.archs:
                assert arch in ARCHITECTURES and f'"{arch}"' in source, (proof.test, arch)


def test_a_proof_marks_the_families_its_test_builds(model_pages: ModuleType, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(model_pages, "collected_archs", lambda test: ("qwen2",))  # pytest's answer, stood in
    parametrized = {p for p in model_pages.PROOFS if p.archs == model_pages.ARCH_PARAM}
    named_qwen2 = {p for p in model_pages.PROOFS if "qwen2" in p.archs and p.archs != model_pages.ARCH_PARAM}
    assert parametrized and set(model_pages.proofs_for("TTQwen2ForCausalLM")) == parametrized | named_qwen2
    llama = model_pages.proofs_for("TTLlamaForCausalLM")
    assert llama and all("llama" in p.archs and p.archs != model_pages.ARCH_PARAM for p in llama)
    assert model_pages.proofs_for("TTNoSuchForCausalLM") == []


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted(DOCS.glob("*.md")):
        assert re.search(rf": {re.escape(page.name)}$", nav, re.M), f"{page.name} is not in mkdocs.yml nav"


def test_serving_guide_lists_every_mesh_preset():
    from vllm_tt_platform.mesh.shape import MESH_PRESETS

    page = (DOCS / "serving.md").read_text()
    for name, shape in MESH_PRESETS.items():
        assert f"| `{name}` | ({shape.rows}, {shape.cols}) |" in page, name


def test_troubleshooting_lists_every_error_type():
    from vllm_tt_platform import errors

    page = (DOCS / "troubleshooting.md").read_text()
    for name in ("TTConfigError", "TTUnsupportedFeatureError", "TTUnsupportedRequestError", "TTDeviceNotFoundError", "TraceNotCapturedError",
                 "MixedStepError", "BundleError", "TTDeviceError", "TTReadbackTimeoutError"):
        assert name in page, name
    assert errors.TTConfigError.__name__ in page
