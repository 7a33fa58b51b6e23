"""The mesh backend is chosen once, config first: `--additional-config.tt.mesh_backend host`
alone (no TT_MESH_BACKEND) serves on the host backend, and vLLM's model registry agrees."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import serve

pytestmark = pytest.mark.e2e


def test_host_backend_from_additional_config_alone(tiny_checkpoint, tmp_path):
    import openai

    log = tmp_path / "serve.log"
    with serve(tiny_checkpoint("llama"), "--served-model-name", "tiny", "--max-num-seqs", "2",
               "--max-model-len", "256", "--additional-config.tt.mesh_backend", "host",
               env={"TT_MESH_BACKEND": ""}, log=log) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        result = client.completions.create(model="tiny", prompt="The river", max_tokens=4, temperature=0)
        assert result.usage.completion_tokens == 4
    text = log.read_text()
    assert "TT backend: host backend (set in --additional-config)" in text
