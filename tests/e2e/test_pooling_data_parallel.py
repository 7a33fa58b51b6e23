"""Pooling models past one engine (issue 32, item 3):

1. a decoder embedding model (Qwen3-Embedding's recipe on the tiny Qwen3, which declares
   ``single_program_lanes``) on two process trees on loopback as two hosts (vLLM's multi-node
   data parallelism: a head serving the OpenAI API, a ``--headless`` host) with
   ``--data-parallel-size 4 --data-parallel-size-local 2`` on ``MESH_DEVICE=N300``: one engine
   per host of 2 lanes, each call pooling its shape on both lanes' sub-meshes side by side;
2. an encoder (tiny BERT, no ``single_program_lanes``) with ``--data-parallel-size 2`` on one
   N300: vLLM's standard data parallelism, two engine processes on a (1,1) sub-mesh each.

Each: 32 concurrent embedding requests equal transformers' vectors, and both engines served
some (vLLM's per-engine request counts on ``/metrics``).
"""

from __future__ import annotations

import concurrent.futures
import re
from pathlib import Path

import httpx
import pytest
from vllm_tt_testing.checkpoints import cached_tiny
from vllm_tt_testing.decoder_pooling import hf_last_token_embeddings
from vllm_tt_testing.tiny_bert import hf_embeddings, inputs_of_lengths, tiny_bert

from tests.e2e.helpers import serve, two_hosts
from tests.e2e.pooling_checks import TINY_BERT_ARGS, assert_close

pytestmark = pytest.mark.e2e

TEXTS = inputs_of_lengths(16, growth=3)
"""16 inputs of 3 to 75 tokens, each sent twice: 32 concurrent requests."""


def embed_concurrently(url: str) -> list[list[float]]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")

    def one(text: str) -> list[float]:
        return client.embeddings.create(model="tiny", input=text, encoding_format="float").data[0].embedding

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        return list(pool.map(one, TEXTS * 2))


def requests_per_engine(url: str) -> dict[str, float]:
    """vLLM's finished requests per engine (DP rank of the head's view)."""
    served: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:request_success_total{"):
            engine = re.search(r'engine="(\d+)"', line)
            assert engine is not None, line
            served[engine.group(1)] = served.get(engine.group(1), 0.0) + float(line.rpartition(" ")[2])
    return served


def test_decoder_embeddings_in_lanes_on_two_hosts_equal_transformers(tmp_path: Path) -> None:
    checkpoint = cached_tiny("qwen3")
    reference = hf_last_token_embeddings(checkpoint, TEXTS)
    with two_hosts(checkpoint, tmp_path, 4, 2, "--runner", "pooling", "--convert", "embed", "--max-model-len", "256",
                   "--max-num-seqs", "4", "--additional-config.tt.pooling_shapes", "1x32,4x32,1x96,4x96",
                   env={"MESH_DEVICE": "N300"}) as hosts:
        got = embed_concurrently(hosts.url)
        served = requests_per_engine(hosts.url)
        for log in (hosts.head_log, hosts.headless_log):
            text = log.read_text()
            assert "2 lanes x 4 rows" in text, text[-3000:]
            assert "programs at 4 shapes (BATCHxLENGTH) on each of 2 lanes' sub-meshes side by side" in text
    assert_close(got, reference.repeat(2, 1))
    assert set(served) == {"0", "1"} and min(served.values()) > 0, served


def test_encoder_embeddings_on_two_engines_equal_transformers(tmp_path: Path) -> None:
    checkpoint = tiny_bert()
    reference = hf_embeddings(checkpoint, TEXTS)
    with serve(checkpoint, *TINY_BERT_ARGS, "--served-model-name", "tiny", "--data-parallel-size", "2",
               "--api-server-count", "1", env={"MESH_DEVICE": "N300", "VLLM_HOST_IP": "127.0.0.1"},
               log=tmp_path / "serve.log") as url:
        got = embed_concurrently(url)
        served = requests_per_engine(url)
    assert "Data parallelism: 2 independent engine(s) on this host" in (tmp_path / "serve.log").read_text()
    assert_close(got, reference.repeat(2, 1))
    assert set(served) == {"0", "1"} and min(served.values()) > 0, served
