"""``vllm-tt-models`` through its console script, as users and CI run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_tt_models_registry.bundle import load_bundle
from vllm_tt_models_registry.errors import BundleError

SCRIPT = Path(sys.executable).parent / "vllm-tt-models"
_OURS = (
    "EXTRA_MODELS_DIR",
    "TT_VLLM_BUILTIN_MODELS",
    "TT_LLAMA_TEXT_VER",
    "TT_QWEN3_TEXT_VER",
    "TT_MESH_BACKEND",
)


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in _OURS}
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env={**base, **env}, timeout=300
    )


def test_list_shows_every_arch_source_target_and_capabilities() -> None:
    result = run("list")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith("TT models for mesh backend 'ttnn': 17 architectures")
    assert "\nTTQwen3_5ForConditionalGeneration\n  source:       builtin\n" in out
    assert "  target:       models.demos.blackhole.qwen36.tt.qwen36_vllm:Qwen36ForCausalLM\n" in out
    assert (
        "  capabilities: declared: kv_cache_kinds=['full_attention', 'sliding_window'], "
        "single_program_lanes (class not importable here)\n" in out
    )


def test_list_names_its_backend_and_says_once_that_tt_metal_is_missing() -> None:
    out = run("list").stdout
    assert (
        "  (mesh backend 'ttnn' from the default: neither --backend nor TT_MESH_BACKEND is set; "
        "other backends here: vllm-tt-models list --backend host)\n" in out
    )
    assert out.count("No module named 'models'") == 1
    assert "note: 17 model classes are not importable here (ModuleNotFoundError: No module named 'models')" in out
    assert "tt-metal's models package is not installed" in out
    assert "(mesh backend 'ttnn' from argument --backend;" in run("list", "--backend", "ttnn").stdout
    from_env = run("list", TT_MESH_BACKEND="ttnn").stdout
    assert "(mesh backend 'ttnn' from environment variable TT_MESH_BACKEND;" in from_env


def test_list_json_with_a_bundle(make_bundle) -> None:
    folder = make_bundle(
        "cli",
        metadata={
            "arch": "LlamaForCausalLM",
            "main_class": "cli_adapter:FooModel",
            "capabilities": {"single_program_lanes": True},
        },
    )
    result = run("list", "--json", EXTRA_MODELS_DIR=str(folder.parent))
    assert result.returncode == 0, result.stderr
    rows = {row["arch"]: row for row in json.loads(result.stdout)}
    llama = rows["TTLlamaForCausalLM"]
    assert llama["source"] == f"bundle:{folder.resolve()}"
    assert llama["target"] == "cli_adapter:FooModel"
    assert llama["declared"] == {"single_program_lanes": True}
    assert llama["capabilities"]["single_program_lanes"] is True
    assert llama["capabilities"]["supports_async_decode"] is True
    assert llama["error"] is None
    assert rows["TTMistralForCausalLM"]["capabilities"] is None


def _fake_source_site(root: Path, adapter_source) -> Path:
    """A site folder with an installed distribution declaring model source ``fakehost``."""
    site = root / "site"
    dist = site / "fake_tt_source-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tt-source\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[vllm_tt.model_sources]\nfakehost = fake_tt_source_mod:TABLE\n")
    (site / "fake_tt_source_mod.py").write_text(
        adapter_source("HostLlama") + '\nTABLE = {"TTLlamaForCausalLM": "fake_tt_source_mod:HostLlama"}\n'
    )
    return site


def test_list_with_a_backend_model_source(tmp_path: Path, adapter_source) -> None:
    site = _fake_source_site(tmp_path, adapter_source)
    result = run("list", "--backend", "fakehost", "--json", PYTHONPATH=str(site))
    assert result.returncode == 0, result.stderr
    rows = {row["arch"]: row for row in json.loads(result.stdout)}
    assert rows["TTLlamaForCausalLM"]["source"] == "fakehost"
    assert rows["TTLlamaForCausalLM"]["capabilities"]["supports_sample_on_device"] is True
    assert rows["TTQwen3ForCausalLM"]["source"] == "builtin"
    # the backend defaults to TT_MESH_BACKEND
    text = run("list", PYTHONPATH=str(site), TT_MESH_BACKEND="fakehost").stdout
    assert (
        "\nTTLlamaForCausalLM\n  source:       fakehost\n  target:       fake_tt_source_mod:HostLlama\n"
        "  capabilities: supports_sample_on_device, supports_async_decode, supports_prefix_caching\n"
    ) in text


def test_list_with_an_unknown_backend_fails() -> None:
    result = run("list", "--backend", "nosuch")
    assert result.returncode == 1
    assert "needs a model source named 'nosuch'" in result.stderr


def test_an_unknown_backend_is_blamed_on_the_input_that_gave_it() -> None:
    typed = run("list", "--backend", "nosuch").stderr
    assert typed.startswith("error: argument --backend 'nosuch': ")
    assert "Fix: use one of --backend ttnn, --backend host," in typed
    assert "TT_MESH_BACKEND" not in typed
    exported = run("list", TT_MESH_BACKEND="nosuch").stderr
    assert exported.startswith("error: environment variable TT_MESH_BACKEND='nosuch': ")
    assert "Fix: use one of TT_MESH_BACKEND=ttnn, TT_MESH_BACKEND=host," in exported


def test_list_with_a_bad_variant_fails() -> None:
    result = run("list", TT_QWEN3_TEXT_VER="qwen3_galaxy")
    assert result.returncode == 1
    assert result.stderr.startswith("error: TT_QWEN3_TEXT_VER='qwen3_galaxy' is not supported")


def test_check_good_bundle_and_folder_of_bundles(make_bundle) -> None:
    first = make_bundle("ok1", metadata={"arch": "AForCausalLM", "main_class": "ok1_adapter:FooModel"})
    make_bundle("ok2", metadata={"arch": "BForCausalLM", "main_class": "ok2_adapter:FooModel"})
    single = run("check", str(first))
    assert single.returncode == 0, single.stderr
    assert single.stdout.startswith(
        f"ok: {first.resolve()}: TTAForCausalLM -> ok1_adapter:FooModel (capabilities: "
    )
    both = run("check", str(first.parent))
    assert both.returncode == 0, both.stderr
    assert both.stdout.count("ok: ") == 2


@pytest.mark.parametrize(
    "metadata",
    [
        {"arch": "FooForCausalLM"},
        {"arch": "FooForCausalLM", "main_class": "bad_adapter:Missing"},
        {"arch": "FooForCausalLM", "main_class": "bad_adapter:FooModel", "min_plugin_version": "99"},
    ],
    ids=["missing_main_class", "missing_class", "too_new"],
)
def test_check_broken_bundle_prints_the_startup_message(make_bundle, metadata) -> None:
    folder = make_bundle("bad", metadata=metadata)
    with pytest.raises(BundleError) as info:
        load_bundle(folder)
    result = run("check", str(folder))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip() == f"error: {info.value}"


def test_check_a_missing_folder_blames_the_argument(tmp_path: Path) -> None:
    result = run("check", str(tmp_path / "nope"))
    assert result.returncode == 1
    assert result.stderr.startswith(
        f"error: model bundle {tmp_path / 'nope'}: argument DIR: is not a directory (it does not exist)."
    )
    assert "EXTRA_MODELS_DIR" not in result.stderr


def test_check_reports_every_problem_of_a_bundle_at_once(make_bundle) -> None:
    folder = make_bundle("many", metadata={"main_clas": "many_adapter:FooModel"})
    result = run("check", str(folder))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == f"error: model bundle {folder.resolve()}: 3 problems:"
    assert lines[1].startswith(
        "  - vllm_metadata.json: unknown field(s) 'main_clas'. Fix: rename 'main_clas' to 'main_class';"
    )
    assert lines[2].startswith("  - vllm_metadata.json field 'arch': missing (it is required). Fix: ")
    assert lines[3].startswith("  - vllm_metadata.json field 'main_class': missing (it is required). Fix: ")
    assert len(lines) == 4


def test_check_empty_folder_fails(tmp_path: Path) -> None:
    result = run("check", str(tmp_path))
    assert result.returncode == 1
    assert "holds no bundle" in result.stderr


def test_schema_is_printed() -> None:
    result = run("schema")
    assert result.returncode == 0
    schema = json.loads(result.stdout)
    assert schema["required"] == ["arch", "main_class"]
    assert set(schema["properties"]) == {
        "arch",
        "main_class",
        "capabilities",
        "description",
        "min_plugin_version",
    }
