"""The traffic tools' client against uvicorn's keep-alive: a client whose event loop runs late.

The lanes soak lost requests to client-side ``httpx.ReadError`` with nothing in the server's log:
a pooled connection was checked for expiry when the request picked it, the client's loop then
ran seconds late (CPU-starved), and the request was written after uvicorn's keep-alive timer had
closed the connection. Here the stall sits exactly between the pool's check and the write, with a
1 s server keep-alive (vLLM's is ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, 5 s).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from vllm_tt_testing import traffic

KEEP_ALIVE_S = 1
STALL_S = 1.4
"""How late the client writes its request after picking a connection (> KEEP_ALIVE_S)."""


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):  # read the whole request, as vLLM does
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(_echo, timeout_keep_alive=KEEP_ALIVE_S, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


async def _stall_after_pick(name: str, info: dict[str, Any]) -> None:
    if name == "http11.send_request_headers.started":
        time.sleep(STALL_S)  # blocks the event loop, as a starved client's does


async def _second_request_after_a_stall(client: httpx.AsyncClient, url: str) -> int:
    """A first request, a short idle (well inside any expiry), then a request written late."""
    async with client:
        assert (await client.post(f"{url}/v1/completions", json={})).status_code == 200
        await asyncio.sleep(0.1)
        response = await client.post(f"{url}/v1/completions", json={}, extensions={"trace": _stall_after_pick})
        return response.status_code


def test_a_late_client_loop_gets_its_answer(url: str) -> None:
    assert asyncio.run(_second_request_after_a_stall(traffic.connection_per_request(4, 10), url)) == 200


def test_a_pooled_connection_is_reset_when_the_client_writes_late(url: str) -> None:
    """What the soak client did before (idle connections expire after 2 s): the reused connection
    was closed by the server during the stall, so the request is reset unanswered. If this starts
    passing, httpx or uvicorn closed the race and connection reuse could come back."""
    pooled = httpx.AsyncClient(timeout=10, limits=httpx.Limits(keepalive_expiry=2.0))
    with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
        asyncio.run(_second_request_after_a_stall(pooled, url))
