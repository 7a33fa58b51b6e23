"""Mixed steps through ``vllm serve`` and the OpenAI client (issue 35), two servers: the trained
tiny llama with ``--additional-config.tt.mixed_steps true`` (the host model declares
``mixed_shapes`` (32, 32), (32, 128)), in one lane and in two lanes (``--data-parallel-size 2``
on an N300). Long prompts arrive while short ones are decoding; they are computed beside the
decodes, one captured chunk a step, and every output equals transformers' greedy tokens. The
step trace and the TT step counter show the mixed steps."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.e2e.helpers import hf_greedy, seeded_prompts, serve, served_metric
from tests.e2e.spec_checks import GREEDY, client_for, complete

pytestmark = pytest.mark.e2e

TRAIN_STEPS = 200  # the block-output and KV offload tests' checkpoint
SHORT_TOKENS = 128
LONG_TOKENS = 8
# Every program takes at least 20 ms of modelled device time, so the short prompts decode for
# seconds and the long ones surely arrive while they do (a host decode step alone takes
# milliseconds: on a quiet engine the short prompts could finish first).
SERVE_ARGS = ("--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512", "--seed", "0",
              "--additional-config.tt.mixed_steps", "true", "--additional-config.tt.host_device_time", "20ms")


LANES = {
    "one-lane": ((), {}),
    # 2 lanes of 4 rows on an N300 (one engine process needs one API server): one lane's chunk
    # beside both lanes' decodes.
    "lanes": (("--data-parallel-size", "2", "--api-server-count", "1"), {"MESH_DEVICE": "N300"}),
}


@pytest.fixture(scope="module", params=sorted(LANES))
def server(request, tmp_path_factory):
    from vllm_tt_testing.checkpoints import cached_tiny

    model_dir = cached_tiny("llama", TRAIN_STEPS)
    folder = tmp_path_factory.mktemp(f"mixed_steps_{request.param}")
    trace = folder / "steps.jsonl"
    args, env = LANES[request.param]
    with serve(model_dir, *SERVE_ARGS, *args, env={"TT_STEP_TRACE": str(trace), **env},
               log=folder / "serve.log") as url:
        # The API server's first requests of each kind take it a second or more (lazy setup):
        # paid here, so the test's long prompts reach the engine while the short ones decode.
        complete(url, seeded_prompts(1, (300,))[0], max_tokens=1, **GREEDY)
        list(_stream_chunks(url, [5, 6, 7], max_tokens=1))  # (neither is a mixed step: nothing decodes)
        yield url, model_dir, trace, folder / "serve.log"


def test_long_prompts_beside_running_decodes_equal_transformers_in_mixed_steps(server):
    url, model_dir, trace, log = server
    short = seeded_prompts(35, (6, 9))
    long = seeded_prompts(36, (300, 170))  # 128 + 128 + 44 and 128 + 42: chunks of both shapes
    decoding = threading.Event()
    streamed: dict[int, list[int]] = {}

    def stream_short(i: int) -> None:
        ids: list[int] = []
        for chunk in _stream_chunks(url, short[i]):
            ids.extend(chunk)
            decoding.set()
        streamed[i] = ids

    threads = [threading.Thread(target=stream_short, args=(i,)) for i in range(len(short))]
    for t in threads:
        t.start()
    assert decoding.wait(120), "the short prompts never started decoding"
    results: dict[int, list[int]] = {}
    longs = [threading.Thread(target=lambda i=i: results.__setitem__(
        i, complete(url, long[i], max_tokens=LONG_TOKENS, **GREEDY)["choices"][0]["token_ids"])) for i in range(2)]
    for t in longs:
        t.start()
    for t in (*threads, *longs):
        t.join(300)
    assert [streamed[i] for i in range(2)] == hf_greedy(model_dir, short, SHORT_TOKENS)
    assert [results[i] for i in range(2)] == hf_greedy(model_dir, long, LONG_TOKENS)

    steps = [json.loads(line) for line in trace.read_text().splitlines()]
    mixed = [s for s in steps if s["phase"] == "mixed"]
    assert mixed, [s["phase"] for s in steps]
    # Each mixed step: one prompt chunk (up to 128 tokens) beside decode rows of one token.
    for step in mixed:
        chunks = [n for n in step["scheduled"].values() if n > 1]
        assert len(chunks) <= 1 and all(n <= 128 for n in chunks), step
        assert sum(1 for n in step["scheduled"].values() if n == 1) >= 1, step
    assert any(128 in s["scheduled"].values() for s in mixed)  # the long prompts' full chunks
    if "lanes" in mixed[0]:  # the lane trace: a chunk in one lane beside decodes in both
        assert any(all(lane["scheduled"] for lane in s["lanes"]) for s in mixed), mixed
    assert _settled(lambda: served_metric(url, "vllm_tt:steps_total", 'phase="mixed"')) == len(mixed)
    assert log.read_text().count("mixed steps: 32 decode rows + 32 tokens, 32 decode rows + 128 tokens") == 1


def _settled(read, wait_s: float = 15.0) -> float:
    """``read()`` once two reads a second apart agree (the engine's metrics thread sends every
    0.25 s)."""
    last, deadline = read(), time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = read()
        if now == last:
            return now
        last = now
    return last


def _stream_chunks(url: str, prompt: list[int], max_tokens: int = SHORT_TOKENS):
    """The token ids of each streamed chunk of a greedy completion of ``max_tokens``."""
    for chunk in client_for(url).completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens,
                                                    stream=True, **GREEDY):
        yield chunk.model_dump()["choices"][0].get("token_ids") or []
