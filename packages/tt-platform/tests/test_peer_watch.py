"""The host liveness watch: a peer's connection ending is reported with who was lost (loopback,
no engine; the two-host end-to-end test kills a real headless host)."""

from __future__ import annotations

import queue
import socket

import pytest
from vllm_tt_platform.errors import TTConfigError
from vllm_tt_platform.mesh import peer_watch
from vllm_tt_platform.mesh.peer_watch import PeerWatch


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_head_reports_a_remote_engine_whose_connection_ends() -> None:
    lost: queue.Queue[str] = queue.Queue()
    port = _free_port()
    peer_watch.start(PeerWatch("127.0.0.1", port, 0, head=True), on_lost=lost.put)
    with socket.create_connection(("127.0.0.1", port)) as remote:
        remote.sendall(b"3\n")
        with pytest.raises(queue.Empty):
            lost.get(timeout=0.3)  # connected and quiet: nothing to report
    assert "lost DP rank 3 at 127.0.0.1" in lost.get(timeout=5)


def test_a_remote_engine_reports_the_head_closing() -> None:
    lost: queue.Queue[str] = queue.Queue()
    with socket.create_server(("127.0.0.1", 0)) as head:
        port = head.getsockname()[1]
        peer_watch.start(PeerWatch("127.0.0.1", port, 5, head=False), on_lost=lost.put)
        conn, _ = head.accept()
        with conn:
            assert conn.recv(16) == b"5\n"
    assert f"lost the head at 127.0.0.1:{port}" in lost.get(timeout=5)


def test_a_remote_engine_waits_for_the_head_to_listen() -> None:
    lost: queue.Queue[str] = queue.Queue()
    port = _free_port()
    peer_watch.start(PeerWatch("127.0.0.1", port, 1, head=False), on_lost=lost.put)
    with socket.create_server(("127.0.0.1", port)) as head:
        head.settimeout(5)
        conn, _ = head.accept()
        conn.close()
    assert "lost the head" in lost.get(timeout=5)


def test_a_taken_watch_port_is_a_typed_error_naming_the_rpc_port() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(TTConfigError, match=f"--data-parallel-rpc-port={port - 1}"):
            peer_watch.start(PeerWatch("127.0.0.1", port, 0, head=True))
