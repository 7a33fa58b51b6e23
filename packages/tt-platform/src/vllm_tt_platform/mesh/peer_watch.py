"""Host liveness across vLLM's multi-node data parallelism.

vLLM watches the engine processes of its own host only: when a ``--headless`` host dies, the
head keeps answering ``/health`` and the requests its load balancer sends to the dead ranks
never complete. The platform closes that gap with one TCP connection per remote engine: the
head's DP rank 0 listens on ``--data-parallel-address`` at ``--data-parallel-rpc-port`` + 1,
every engine of another host connects and holds the connection open. Nothing is sent on it; a
process that exits closes it (the kernel does so even on SIGKILL), and TCP keep-alive probes
notice a host that vanished without closing (power loss, network cut) in about
``KEEPALIVE_S`` seconds. When the connection ends, the engine on either side stops itself with
an error naming the lost peer, and vLLM's own watch of local engines then stops that host (the
head's API server exits, so a supervisor restarts the deployment).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from vllm.logger import init_logger

from vllm_tt_platform.errors import TTConfigError

logger = init_logger("vllm." + __name__)

KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 10, 5, 4
KEEPALIVE_S = KEEPALIVE_IDLE_S + KEEPALIVE_INTERVAL_S * KEEPALIVE_PROBES
"""Longest time a silently vanished peer goes unnoticed."""
CONNECT_RETRY_S = 1.0
LOST_EXIT_CODE = 70
"""Exit status of an engine that lost a peer host (EX_SOFTWARE)."""


@dataclass(frozen=True)
class PeerWatch:
    """One engine's side of the host liveness watch."""

    address: str
    """The head's address (``--data-parallel-address``)."""
    port: int
    rank: int
    """This engine's global DP rank (vLLM's numbering: hosts with lanes count one rank each)."""
    head: bool
    """True for the head's rank 0, which listens; every engine of another host connects."""

    def describe(self) -> str:
        side = "watching the other hosts' engines" if self.head else "watched by the head"
        return f"DP rank {self.rank} {side} on {self.address}:{self.port}"


def _stop_engine(reason: str) -> None:
    logger.error("%s: this engine stops, so vLLM stops serving on this host (restart the whole deployment).",
                 reason)
    os._exit(LOST_EXIT_CODE)  # from a watch thread: nothing else can stop the engine process now


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                        ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _wait_closed(sock: socket.socket) -> None:
    """Block until the peer closes the connection or it breaks."""
    with contextlib.suppress(OSError):
        while sock.recv(64):
            pass


def start(watch: PeerWatch, on_lost: Callable[[str], None] = _stop_engine) -> threading.Thread:
    """Start this engine's side of the watch in a daemon thread; ``on_lost`` gets the reason
    once the connection to a peer ends."""
    if watch.head:
        try:
            listener = socket.create_server((watch.address, watch.port))
        except OSError as error:
            raise _bind_error(watch, error) from error
        logger.info("Host watch: %s.", watch.describe())
        target: Callable[[], None] = lambda: _accept(listener, on_lost)  # noqa: E731
    else:
        target = lambda: _hold(watch, on_lost)  # noqa: E731
    thread = threading.Thread(target=target, daemon=True, name="TTPeerWatch")
    thread.start()
    return thread


def _bind_error(watch: PeerWatch, error: OSError) -> TTConfigError:
    return TTConfigError(
        "--data-parallel-rpc-port", watch.port - 1, f"a port whose successor {watch.port} is free on "
        f"{watch.address} (the head's host watch listens there; {error.strerror})",
        "choose another --data-parallel-rpc-port on every host",
    )


def _accept(listener: socket.socket, on_lost: Callable[[str], None]) -> None:
    while True:
        conn, peer = listener.accept()
        _keepalive(conn)
        threading.Thread(target=_watch_peer, args=(conn, peer, on_lost), daemon=True, name="TTPeerWatch").start()


def _watch_peer(conn: socket.socket, peer: tuple[str, int], on_lost: Callable[[str], None]) -> None:
    rank = b""
    with contextlib.suppress(OSError):
        while not rank.endswith(b"\n"):
            chunk = conn.recv(16)
            if not chunk:
                break
            rank += chunk
    logger.info("Host watch: DP rank %s at %s connected.", rank.decode().strip() or "?", peer[0])
    _wait_closed(conn)
    on_lost(f"Host watch: lost DP rank {rank.decode().strip() or '?'} at {peer[0]} (its host's engine exited, "
            "or the host is unreachable)")


def _hold(watch: PeerWatch, on_lost: Callable[[str], None]) -> None:
    while True:
        try:
            sock = socket.create_connection((watch.address, watch.port), timeout=CONNECT_RETRY_S)
            break
        except OSError:
            time.sleep(CONNECT_RETRY_S)
    sock.settimeout(None)
    _keepalive(sock)
    sock.sendall(f"{watch.rank}\n".encode())
    logger.info("Host watch: %s.", watch.describe())
    _wait_closed(sock)
    on_lost(f"Host watch: lost the head at {watch.address}:{watch.port} (its engine exited, or it is unreachable)")
