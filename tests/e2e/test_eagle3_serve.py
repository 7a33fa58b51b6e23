"""An EAGLE-3 head through `vllm serve` (``method: eagle3``, issue 31), one server, in lane mode:
the host backend emulating a Galaxy (``MESH_DEVICE=TG``), ``--data-parallel-size 4`` folded into
4 lanes of 2 rows, the trained tiny EAGLE-3 head beside the trained tiny Llama on the same mesh,
K=3, device sampling on, a 20 ms program floor (so requests overlap in every lane).

Greedy streaming equals non-streaming equals transformers' target, 24 clients at once (small
per-lane KV pools preempt rows with drafts in flight); stop strings end the text exactly;
vLLM's /metrics count accepted drafts; the startup summary names the method, K, the verify
shape per lane, where the head runs, the target layers it reads and what its KV costs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.helpers import serve
from tests.e2e.spec_checks import (
    assert_served_streaming_equals_plain,
    assert_stop_strings_exact,
    mixed_prompts,
)

pytestmark = pytest.mark.e2e

LANES, ROWS, K = 4, 2, 3
MAX_NEW_TOKENS = 24


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from vllm_tt_testing.checkpoints import cached_eagle3

    model_dir, head_dir = cached_eagle3()
    assert json.loads((model_dir / "config.json").read_text())["model_type"] == "llama"  # the family proven
    spec = {"method": "eagle3", "model": str(head_dir), "num_speculative_tokens": K}
    log = tmp_path_factory.mktemp("eagle3_serve") / "serve.log"
    args = ("--served-model-name", "tiny", "--data-parallel-size", str(LANES), "--max-num-seqs", str(ROWS),
            "--api-server-count", "1", "--max-model-len", "256", "--speculative-config", json.dumps(spec),
            "--num-gpu-blocks-override", "5", "--additional-config.tt.sample_on_device_mode", "all",
            "--additional-config.tt.host_device_time", "20ms")
    with serve(model_dir, *args, env={"MESH_DEVICE": "TG"}, log=log) as url:
        yield model_dir, head_dir, url, log


@pytest.fixture(scope="module")
def prompts(server) -> list[list[int]]:
    from transformers import AutoTokenizer

    return mixed_prompts(AutoTokenizer.from_pretrained(server[0]).vocab_size)


def test_streaming_equals_plain_equals_transformers_in_lanes(server, prompts):
    model_dir, _, url, _ = server
    assert_served_streaming_equals_plain(url, model_dir, prompts, MAX_NEW_TOKENS)


def test_stop_strings_end_the_text_exactly(server, prompts):
    _, _, url, _ = server
    assert_stop_strings_exact(url, prompts[:8])


def test_startup_summary_names_the_head(server):
    _, head_dir, _, log = server
    text = Path(log).read_text()
    assert (f"speculation eagle3, K={K}, verify trace [{ROWS} rows, {1 + K}] per lane x {LANES} lanes, "
            "verified on device when every row is greedy") in text
    assert (f"EAGLE-3 head {head_dir} (1 layer, draft vocabulary 512) on the mesh beside the model, reading "
            "target layers [0, 1, 2] kept on device, KV 16.0 KiB/block") in text
