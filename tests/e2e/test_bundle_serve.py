"""The example bundle in docs/examples/bundle really serves through `vllm serve` on the host
backend, in place of the builtin Llama."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import serve

pytestmark = pytest.mark.e2e

BUNDLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "bundle"


def test_example_bundle_serves(tiny_checkpoint, tmp_path):
    import openai

    log = tmp_path / "serve.log"
    with serve(tiny_checkpoint("llama"), "--served-model-name", "tiny", "--max-num-seqs", "2",
               "--max-model-len", "256", env={"EXTRA_MODELS_DIR": str(BUNDLES)}, log=log) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        result = client.completions.create(model="tiny", prompt="A bundle", max_tokens=5, temperature=0)
        assert result.usage.completion_tokens == 5
    text = log.read_text()
    assert "example bundle: ExampleLlamaForCausalLM serves" in text
    assert f"from bundle:{BUNDLES / 'host_llama'}" in text
