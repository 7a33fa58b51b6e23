"""docs/bundles.md stays true to the code, and the example bundle passes the startup checks."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from vllm_tt_models_registry.builtin import BUILTIN_FAMILIES
from vllm_tt_models_registry.capabilities import ModelCapabilities
from vllm_tt_models_registry.contract import CALLS
from vllm_tt_models_registry.envs import markdown_table

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "bundles.md"
EXAMPLE = REPO / "docs" / "examples" / "bundle"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text()


def test_env_table_is_current(doc: str) -> None:
    assert markdown_table() in doc


def test_every_builtin_target_is_documented(doc: str) -> None:
    for fam in BUILTIN_FAMILIES:
        for arch in fam.archs:
            assert f"`TT{arch}`" in doc
        for name, variant in fam.variants.items():
            assert f"`{variant.target}`" in doc
            if fam.selector is not None:
                assert f"`{fam.selector.name}={name}`" in doc


def test_every_capability_and_call_is_documented(doc: str) -> None:
    for f in fields(ModelCapabilities):
        assert f"| `{f.name}` |" in doc
    for shape in CALLS.values():
        assert shape.render() in doc, shape.member


def test_example_bundle_passes_check() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TT_", "EXTRA_MODELS_DIR"))}
    result = subprocess.run(
        [str(Path(sys.executable).parent / "vllm-tt-models"), "check", str(EXAMPLE)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(
        f"ok: {EXAMPLE / 'host_llama'}: TTLlamaForCausalLM -> host_llama_example:ExampleLlamaForCausalLM"
    )
    assert "supports_prefix_caching" in result.stdout
