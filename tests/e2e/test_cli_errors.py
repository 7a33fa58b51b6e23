"""Configuration mistakes reach a `vllm serve` user as a non-zero exit with the TT message on
stderr, before any device work."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.e2e.helpers import vllm_command

pytestmark = pytest.mark.e2e

CASES = [
    ("unknown-key", ["--additional-config.tt.trace_mod", "all"], {}, "--additional-config.tt.trace_mod",
     "did you mean --additional-config.tt.trace_mode"),
    ("tensor-parallel", ["-tp", "2"], {}, "--tensor-parallel-size", "MESH_DEVICE"),
    ("mesh-device", [], {"MESH_DEVICE": "T4K"}, "MESH_DEVICE='T4K'", "T3K"),
    ("async-without-capability", ["--async-scheduling"], {"EXTRA_MODELS_DIR": "<limited bundle>"},
     "--async-scheduling", "supports_async_decode"),
    ("prefix-caching-without-capability", ["--enable-prefix-caching"], {"EXTRA_MODELS_DIR": "<limited bundle>"},
     "--enable-prefix-caching", "supports_prefix_caching"),
]


@pytest.fixture(scope="module")
def limited_bundles(tmp_path_factory) -> str:
    """A bundle serving Llama checkpoints with a model that declares neither async decode nor
    prefix caching."""
    root = tmp_path_factory.mktemp("bundles")
    bundle = root / "sync_llama"
    bundle.mkdir()
    (bundle / "vllm_metadata.json").write_text(json.dumps({
        "arch": "LlamaForCausalLM", "main_class": "sync_llama:SyncLlama",
        "capabilities": {"supports_async_decode": False, "supports_prefix_caching": False},
    }))
    (bundle / "sync_llama.py").write_text(
        "from vllm_tt_host.models.families import HostLlamaForCausalLM\n\n\n"
        "class SyncLlama(HostLlamaForCausalLM):\n    pass\n"
    )
    return str(root)


@pytest.mark.parametrize(("args", "env", "setting", "hint"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_serve_rejects_bad_configuration(tiny_checkpoint, limited_bundles, args, env, setting, hint):
    model = tiny_checkpoint("llama")
    env = {k: limited_bundles if v == "<limited bundle>" else v for k, v in env.items()}
    result = subprocess.run(
        vllm_command("serve", str(model), "--port", "1", "--max-model-len", "256", *args),
        env={**os.environ, "TT_MESH_BACKEND": "host", **env}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert setting in result.stderr, result.stderr[-2000:]
    assert hint in result.stderr
