"""One `vllm serve` shows two start-up choices at once: the mesh backend is chosen once, config
first (`--additional-config.tt.mesh_backend host` alone, no TT_MESH_BACKEND, serves on the host
backend and vLLM's model registry agrees), and the example bundle in docs/examples/bundle
really serves, in place of the builtin Llama."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import serve

pytestmark = pytest.mark.e2e

BUNDLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "bundle"


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    import openai

    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve(tiny_checkpoint("llama"), "--served-model-name", "tiny", "--max-num-seqs", "2",
               "--max-model-len", "256", "--additional-config.tt.mesh_backend", "host",
               env={"TT_MESH_BACKEND": "", "EXTRA_MODELS_DIR": str(BUNDLES)}, log=log) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused"), log


def test_host_backend_from_additional_config_alone(server):
    client, log = server
    result = client.completions.create(model="tiny", prompt="The river", max_tokens=4, temperature=0)
    assert result.usage.completion_tokens == 4
    assert "TT backend: host backend (set in --additional-config)" in log.read_text()


def test_example_bundle_serves(server):
    client, log = server
    result = client.completions.create(model="tiny", prompt="A bundle", max_tokens=5, temperature=0)
    assert result.usage.completion_tokens == 5
    text = log.read_text()
    assert "example bundle: ExampleLlamaForCausalLM serves" in text
    assert f"from bundle:{BUNDLES / 'host_llama'}" in text
