"""Device faults while serving: a prefill or decode program that raises, a readback that never
completes, a readback of the wrong shape. Each ends in bounded time - never a hang - with the
requests in flight answered with an error, the engine stopping with a ``TTDeviceError`` that
names the failing call, and the API server following (docs/troubleshooting.md#device-faults).

One ``vllm serve`` per fault kind (the engine does not survive a fault); the fault is armed
after a first request was served normally (``vllm_tt_testing.device_faults``).
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from vllm_tt_testing.device_faults import FaultKind, server_env

from tests.e2e.helpers import living_group_members, serve_process

pytestmark = pytest.mark.e2e

TESTING_DIR = Path(__file__).resolve().parents[2] / "testing"
READBACK_TIMEOUT_S = 3.0
SERVER = (
    "--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512", "--async-scheduling",
    "--additional-config.tt.sample_on_device_mode", "all", "--additional-config.tt.host_device_time", "20ms",
    "--additional-config.tt.readback_timeout_s", str(READBACK_TIMEOUT_S),
)
MAX_TOKENS = 400
"""At 20 ms a program, a request runs 8 s or more: still in flight when the fault fires."""
ANSWER_BOUND_S = 30.0
"""From arming the fault until every request in flight has its answer."""
EXIT_BOUND_S = 60.0
"""From arming the fault until no process of the server's tree runs."""
MESSAGES = {
    FaultKind.PREFILL_RAISES: r"TT device prefill step failed: InjectedDeviceError: injected fault: the prefill",
    # An overlapped decode's error surfaces where its tokens are read back.
    FaultKind.DECODE_RAISES: r"TT device decode (step|step \d+ readback) failed: InjectedDeviceError: injected "
                             r"fault: the decode",
    FaultKind.READBACK_HANGS: r"TT device decode (readback|step \d+ readback) failed: it did not complete within "
                              r"--additional-config.tt.readback_timeout_s=3 s",
    FaultKind.READBACK_GARBAGE: r"TT device decode (readback|step \d+ readback) failed: ModelOutputError: "
                                r"\w+.decode_forward returned tokens of shape \(2, 3\), expected \[4\]",
}


@dataclass(frozen=True)
class Answer:
    status: int
    streamed: bool
    text: str
    """The body, or every stream event joined."""
    error: bool
    """An error status, or a stream carrying an error event instead of ending with [DONE]."""


def _ask(url: str, i: int, *, stream: bool) -> Answer:
    body = {"model": "tiny", "prompt": f"Fault story {i}", "max_tokens": MAX_TOKENS, "ignore_eos": True,
            "temperature": 0, "stream": stream}
    try:
        if not stream:
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            return Answer(response.status_code, False, response.text, response.status_code >= 400)
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as response:
            events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
        failed = any('"error"' in e for e in events) or events[-1:] != ["[DONE]"]
        return Answer(response.status_code, True, "\n".join(events), response.status_code >= 400 or failed)
    except httpx.TransportError as exc:  # the server closed the connection without an answer
        return Answer(0, stream, f"{type(exc).__name__}: {exc}", True)


def _running(url: str) -> float:
    found = re.search(r"^vllm:num_requests_running\{[^}]*\} (\S+)$", httpx.get(f"{url}/metrics", timeout=5).text, re.M)
    return float(found.group(1)) if found else 0.0


def _served_normally(url: str) -> None:
    response = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": "A clean start", "max_tokens": 8, "ignore_eos": True, "temperature": 0})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize("kind", list(FaultKind), ids=[k.value for k in FaultKind])
def test_a_device_fault_answers_requests_in_flight_with_an_error_and_stops_the_server(
        tiny_checkpoint, tmp_path: Path, kind: FaultKind):
    arm, log = tmp_path / "armed", tmp_path / "serve.log"
    with serve_process(tiny_checkpoint("llama"), *SERVER, env=server_env(kind, arm, TESTING_DIR), log=log) as server:
        _served_normally(server.url)
        # Requests in flight first (decoding), then the fault; a prefill fault needs one more
        # request to start a prefill.
        in_flight = 3 if kind is FaultKind.PREFILL_RAISES else 4
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(_ask, server.url, i, stream=i % 2 == 1) for i in range(in_flight)]
            deadline = time.monotonic() + 120
            while _running(server.url) < in_flight:
                assert time.monotonic() < deadline, "the requests never all ran"
                assert not any(f.done() for f in futures), [f.result() for f in futures if f.done()]
                time.sleep(0.05)
            arm.touch()
            armed_at = time.monotonic()
            if kind is FaultKind.PREFILL_RAISES:
                futures.append(pool.submit(_ask, server.url, in_flight, stream=False))
            answers = [f.result() for f in futures]
        answered_s = time.monotonic() - armed_at
        while living := living_group_members(server.process.pid):
            waited = time.monotonic() - armed_at
            assert waited < EXIT_BOUND_S, f"server still running {waited:.1f}s after the fault: pids {living}"
            time.sleep(0.2)
        exit_s = time.monotonic() - armed_at
    print(f"\n[device fault] {kind.value}: {len(answers)} answered within {answered_s:.1f}s "
          f"({sorted({(a.streamed, a.status) for a in answers})}), server tree gone after {exit_s:.1f}s")
    assert answered_s < ANSWER_BOUND_S
    for answer in answers:
        assert answer.error, answer
        assert answer.status != 0, f"no HTTP answer: {answer}"
        if not answer.streamed:
            assert answer.status >= 500 and json.loads(answer.text)["error"]["message"], answer
    said = [line for line in log.read_text().splitlines() if "TT device" in line]
    assert any(re.search(MESSAGES[kind], line) for line in said), said
    assert any("Fix: check the device" in line for line in said), said
