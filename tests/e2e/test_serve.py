"""`vllm serve` on the host mesh backend answers the OpenAI API: completions, chat, streaming,
concurrent clients."""

from __future__ import annotations

import concurrent.futures

import pytest

from tests.e2e.helpers import SPAWN, serve

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(tiny_checkpoint, tmp_path_factory):
    model_dir = tiny_checkpoint("llama")
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve(model_dir, "--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512",
               log=log, start_method=SPAWN) as url:  # exactly the README's server
        yield url


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused")


def test_completion(client):
    result = client.completions.create(model="tiny", prompt="The river", max_tokens=8, temperature=0)
    assert result.choices[0].text
    assert result.usage.completion_tokens >= 1


def test_chat_completion(client):
    result = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello there"}], max_tokens=8, temperature=0,
    )
    assert result.choices[0].message.content is not None
    assert result.usage.completion_tokens >= 1


def test_streaming_equals_non_streaming(client):
    full = client.completions.create(model="tiny", prompt="A quiet morning", max_tokens=10, temperature=0)
    chunks = client.completions.create(model="tiny", prompt="A quiet morning", max_tokens=10, temperature=0,
                                       stream=True)
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == full.choices[0].text


def test_concurrent_clients_get_their_own_answers(client):
    prompts = [f"Story number {i} begins" for i in range(10)]

    def ask(prompt: str) -> str:
        return client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0).choices[0].text

    alone = [ask(p) for p in prompts[:3]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=10) as pool:
        together = list(pool.map(ask, prompts))
    assert together[:3] == alone
