"""The checkpoint's own MTP module through ``vllm serve`` (``method: mtp``, issue 31), one server
per family, device sampling on, K=2:

- DeepSeek V3 (declares ``single_program_lanes``) in lane mode: the host backend emulating a
  Galaxy (``MESH_DEVICE=TG``), ``--data-parallel-size 4`` folded into 4 lanes of 2 rows, small
  per-lane KV pools (9 blocks of 32 tokens), a 20 ms program floor so that requests overlap in
  every lane;
- Qwen 3.5 (recurrent hybrid, one engine per mesh) on one N150.

Greedy streaming equals non-streaming equals transformers' target, 24 clients at once, with
accepted drafts on vLLM's /metrics; stop strings end the text exactly; the startup summary names
the method, K and the verify shape.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import serve
from tests.e2e.spec_checks import (
    assert_served_streaming_equals_plain,
    assert_stop_strings_exact,
    mixed_prompts,
)

pytestmark = pytest.mark.e2e

K = 2
MAX_NEW_TOKENS = 24
SERVED = {
    "deepseek_v3": ({"MESH_DEVICE": "TG"}, ("--data-parallel-size", "4", "--max-num-seqs", "2",
                                            "--num-gpu-blocks-override", "9", "--additional-config.tt.host_device_time",
                                            "20ms"), "verify trace [2 rows, 3] per lane x 4 lanes"),
    "qwen3_5": ({"MESH_DEVICE": "N150"}, ("--max-num-seqs", "4"), "verify trace [4 rows, 3]"),
}
"""Per family: environment, serve options and the verify shape the startup summary names."""


@pytest.fixture(scope="module", params=sorted(SERVED))
def server(request, tmp_path_factory):
    from vllm_tt_testing.checkpoints import cached_mtp
    from vllm_tt_testing.tiny_mtp import cached_qwen3_5_mtp

    env, args, verify = SERVED[request.param]
    model_dir = cached_mtp() if request.param == "deepseek_v3" else cached_qwen3_5_mtp()
    log = tmp_path_factory.mktemp(f"mtp_serve_{request.param}") / "serve.log"
    spec = json.dumps({"method": "mtp", "num_speculative_tokens": K})
    with serve(model_dir, "--served-model-name", "tiny", "--api-server-count", "1", "--max-model-len", "256",
               "--block-size", "32", "--speculative-config", spec,
               "--additional-config.tt.sample_on_device_mode", "all", *args, env=env, log=log) as url:
        yield model_dir, url, log, verify


@pytest.fixture(scope="module")
def prompts(server) -> list[list[int]]:
    from transformers import AutoTokenizer

    return mixed_prompts(AutoTokenizer.from_pretrained(server[0]).vocab_size)


def test_streaming_equals_plain_equals_transformers(server, prompts):
    model_dir, url, _, _ = server
    assert_served_streaming_equals_plain(url, model_dir, prompts, MAX_NEW_TOKENS)


def test_stop_strings_end_the_text_exactly(server, prompts):
    assert_stop_strings_exact(server[1], prompts[:8])


def test_startup_summary_names_mtp(server):
    _, _, log, verify = server
    text = log.read_text()
    assert f"speculation mtp, K={K}, {verify}" in text, text[-4000:]
    assert "the checkpoint's MTP module (1 layer) inside the model on the mesh" in text
