"""A decoder served as an embedding model (Qwen3-Embedding's recipe: ``vllm serve <Qwen3ForCausalLM
checkpoint> --runner pooling --convert embed``; vLLM's LAST pooling, normalised) on the host
mesh backend: the OpenAI client's embeddings (float and base64) equal transformers' last-token
vectors for 16 inputs of different lengths, one per request, all in one request and from 32
concurrent clients; an input longer than the longest shape and a generation request get a 4xx
naming the fix, and the server goes on serving."""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import numpy as np
import pytest
from vllm_tt_testing.checkpoints import cached_tiny
from vllm_tt_testing.decoder_pooling import hf_last_token_embeddings
from vllm_tt_testing.tiny_bert import inputs_of_lengths

from tests.e2e.helpers import serve
from tests.e2e.pooling_checks import assert_close

pytestmark = pytest.mark.e2e

SHAPES = "1x32,4x32,8x32,1x64,4x64,1x96,4x96"
"""Longest shape 96 tokens, under --max-model-len 256: the TT limit, not vLLM's, refuses longer."""
MODEL = "tiny-qwen3-embedding"


@pytest.fixture(scope="module")
def checkpoint():
    return cached_tiny("qwen3")


@pytest.fixture(scope="module")
def texts():
    return inputs_of_lengths(16, growth=3)  # 3 to 75 tokens


@pytest.fixture(scope="module")
def reference(checkpoint, texts):
    return hf_last_token_embeddings(checkpoint, texts)


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("decoder-embedding-serve") / "serve.log"
    with serve(checkpoint, "--runner", "pooling", "--convert", "embed", "--served-model-name", MODEL,
               "--max-model-len", "256", "--max-num-seqs", "8", "--additional-config.tt.pooling_shapes", SHAPES,
               log=log) as url:
        yield url, log


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused")


def test_inputs_differ(reference):
    """The oracle's vectors are far apart, so the cosine bound tells inputs apart."""
    assert (reference @ reference.T).fill_diagonal_(0).max().item() < 0.99


def test_startup_summary_lists_last_pooling(server):
    log = server[1].read_text()
    assert "pooling model (LAST pooling, tasks embed), no KV cache; programs at 7 shapes" in log, log[-3000:]


def test_each_input_alone_equals_transformers(client, texts, reference):
    got = [client.embeddings.create(model=MODEL, input=t, encoding_format="float").data[0].embedding for t in texts]
    assert_close(got, reference)


def test_all_inputs_in_one_request_base64_on_the_wire(server, texts, reference):
    body = httpx.post(f"{server[0]}/v1/embeddings", json={"model": MODEL, "input": texts, "encoding_format": "base64"},
                      timeout=120).json()
    rows = sorted(body["data"], key=lambda d: d["index"])
    assert_close([np.frombuffer(base64.b64decode(r["embedding"]), dtype=np.float32) for r in rows], reference)


def test_32_concurrent_clients(client, texts, reference):
    order = [i % len(texts) for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda i: client.embeddings.create(model=MODEL, input=texts[i]).data[0].embedding, order))
    assert_close(got, reference[order])


def test_over_long_input_is_a_400_naming_the_limit(server, texts, reference):
    long_text = inputs_of_lengths(16, growth=6)[-1]  # about 140 tokens: under --max-model-len, over 96
    response = httpx.post(f"{server[0]}/v1/embeddings", json={"model": MODEL, "input": long_text}, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "longest pooling shape" in message and "(96 tokens)" in message, message
    after = httpx.post(f"{server[0]}/v1/embeddings", json={"model": MODEL, "input": texts[5]}, timeout=60)
    assert_close([after.json()["data"][0]["embedding"]], reference[5:6])


def test_generation_request_is_refused_and_serving_goes_on(server, texts, reference):
    response = httpx.post(f"{server[0]}/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 4},
                          timeout=60)
    assert 400 <= response.status_code < 500, response.text
    after = httpx.post(f"{server[0]}/v1/embeddings", json={"model": MODEL, "input": texts[2]}, timeout=60)
    assert_close([after.json()["data"][0]["embedding"]], reference[2:3])
