"""A pooling model through ``vllm serve --runner pooling`` on the host mesh backend: the OpenAI
client's embeddings (float and base64) equal transformers' CLS-pooled, normalised vectors for
16 inputs of different lengths, one per request, all in one request and from 32 concurrent
clients; the startup summary lists the captured shapes; an input longer than the longest shape
and a generation request get a 4xx naming the fix, and the server goes on serving."""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import numpy as np
import pytest
from vllm_tt_testing.tiny_bert import hf_embeddings, inputs_of_lengths, tiny_bert

from tests.e2e.helpers import serve
from tests.e2e.pooling_checks import TINY_BERT_ARGS, assert_close

pytestmark = pytest.mark.e2e

SHAPES = "1x32,4x32,8x32,1x96,4x96"
"""Longest shape 96 tokens, under --max-model-len 128: the TT limit, not vLLM's, refuses longer."""


@pytest.fixture(scope="module")
def checkpoint():
    return tiny_bert()


@pytest.fixture(scope="module")
def texts():
    return inputs_of_lengths(16, growth=3)  # 4 to 65 tokens


@pytest.fixture(scope="module")
def reference(checkpoint, texts):
    return hf_embeddings(checkpoint, texts)


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("pooling-serve") / "serve.log"
    with serve(checkpoint, *TINY_BERT_ARGS, "--served-model-name", "tiny-bert",
               "--additional-config.tt.pooling_shapes", SHAPES, log=log) as url:
        yield url, log


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key="unused")


def test_startup_summary_lists_the_shapes(server):
    log = server[1].read_text()
    assert "no KV cache; programs at 5 shapes (BATCHxLENGTH): 1x32, 1x96, 4x32, 4x96, 8x32" in log
    assert "captured trace pool[len=96,batch=4]" in log


def test_each_input_alone_equals_transformers(client, texts, reference):
    got = [client.embeddings.create(model="tiny-bert", input=t, encoding_format="float").data[0].embedding
           for t in texts]
    assert_close(got, reference)


def test_all_inputs_in_one_request_base64(client, texts, reference):
    response = client.embeddings.create(model="tiny-bert", input=texts, encoding_format="base64")
    rows = sorted(response.data, key=lambda d: d.index)
    # The OpenAI client decodes base64 itself unless asked for it; decode the wire form here.
    got = [np.frombuffer(base64.b64decode(r.embedding), dtype=np.float32) if isinstance(r.embedding, str)
           else r.embedding for r in rows]
    assert_close(got, reference)


def test_base64_on_the_wire(server, texts, reference):
    body = httpx.post(f"{server[0]}/v1/embeddings", json={"model": "tiny-bert", "input": texts[:3],
                                                         "encoding_format": "base64"}, timeout=60).json()
    got = [np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32) for d in body["data"]]
    assert_close(got, reference[:3])


def test_32_concurrent_clients(client, texts, reference):
    order = [i % len(texts) for i in range(32)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        got = list(pool.map(lambda i: client.embeddings.create(model="tiny-bert", input=texts[i]).data[0].embedding,
                            order))
    assert_close(got, reference[order])


def test_over_long_input_is_a_400_naming_the_limit(server, texts, reference):
    long_text = inputs_of_lengths(16, growth=6)[-1]  # 126 tokens: under --max-model-len, over 96
    response = httpx.post(f"{server[0]}/v1/embeddings", json={"model": "tiny-bert", "input": long_text}, timeout=60)
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert "longest pooling shape" in message and "(96 tokens)" in message, message
    assert "--additional-config.tt.pooling_shapes" in message, message
    after = httpx.post(f"{server[0]}/v1/embeddings", json={"model": "tiny-bert", "input": texts[5]}, timeout=60)
    assert_close([after.json()["data"][0]["embedding"]], reference[5:6])


def test_generation_request_is_refused_and_serving_goes_on(server, texts, reference):
    response = httpx.post(f"{server[0]}/v1/completions",
                          json={"model": "tiny-bert", "prompt": "hello", "max_tokens": 4}, timeout=60)
    assert 400 <= response.status_code < 500, response.text
    assert response.text
    after = httpx.post(f"{server[0]}/v1/embeddings", json={"model": "tiny-bert", "input": texts[2]}, timeout=60)
    assert_close([after.json()["data"][0]["embedding"]], reference[2:3])
