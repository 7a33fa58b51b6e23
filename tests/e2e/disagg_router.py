"""A router in front of a prefill engine and a decode engine, in the pattern of vLLM's
disaggregated-serving proxy (``examples/online_serving/disaggregated_serving/``): each
completion goes to the prefill engine with ``max_tokens=1`` (which stores the prompt's KV
through the connector), then unchanged to the decode engine, whose answer (streamed or not)
is the client's. Plain HTTP on loopback; no protocol of its own."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

ROUTES = ("/v1/completions", "/v1/chat/completions")


@contextlib.contextmanager
def disagg_router(prefill_url: str, decode_url: str) -> Iterator[str]:
    """Serve the router on 127.0.0.1 and yield its base URL."""

    class Route(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            if self.path not in ROUTES:
                self.send_error(404, f"the router serves {', '.join(ROUTES)}")
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prefill = {**body, "max_tokens": 1, "stream": False}
            prefill.pop("max_completion_tokens", None)
            prefilled = httpx.post(prefill_url + self.path, json=prefill, timeout=300)
            if prefilled.status_code != 200:
                self._reply(prefilled.status_code, prefilled.headers.get("content-type", ""), [prefilled.content])
                return
            with httpx.stream("POST", decode_url + self.path, json=body, timeout=300) as decoded:
                self._reply(decoded.status_code, decoded.headers.get("content-type", ""), decoded.iter_raw())

        def _reply(self, status: int, content_type: str, chunks) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Route)
    thread = threading.Thread(target=server.serve_forever, name="disagg-router", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
