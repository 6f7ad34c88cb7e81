"""The fault proxy ends what it holds: a reset reaches both peers at once and close()
leaves no thread behind, even while both ends of a connection are silent (a thread of
the proxy blocked reading each)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from faults.proxy import FaultProxy

# A bound on a wait that ends as soon as what it waits for happens; never reached when
# the proxy behaves.
BOUND_SECONDS = 10.0


class SilentUpstream:
    """A loopback server that accepts and reads, never answers and never closes first."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = threading.Event()
        self.ended = threading.Event()
        self.conn: socket.socket | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.conn, _ = self.listener.accept()
        try:
            while self.conn.recv(1024):
                self.received.set()
        except OSError:
            pass
        self.ended.set()  # the proxy's end of the connection went away (FIN or RST)

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                sock.close()


@pytest.fixture
def upstream() -> Iterator[SilentUpstream]:
    server = SilentUpstream()
    yield server
    server.close()


def _proxy_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t not in before and t.is_alive()]


def _open_silent_connection(proxy: FaultProxy, upstream: SilentUpstream) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=BOUND_SECONDS)
    client.sendall(b"x")
    assert upstream.received.wait(BOUND_SECONDS), "the proxy did not forward the first byte"
    return client


def test_close_ends_every_thread_while_both_peers_are_silent(upstream: SilentUpstream) -> None:
    before = set(threading.enumerate())
    proxy = FaultProxy("127.0.0.1", upstream.port)
    client = _open_silent_connection(proxy, upstream)
    try:
        assert _proxy_threads(before), "the proxy should be piping the connection"
        proxy.close()
        deadline = time.monotonic() + BOUND_SECONDS
        for thread in _proxy_threads(before):
            thread.join(timeout=max(deadline - time.monotonic(), 0))
        left = _proxy_threads(before)
        assert left == [], f"threads left after close(): {[t.name for t in left]}"
    finally:
        client.close()


def test_a_reset_reaches_both_silent_peers_as_a_reset(upstream: SilentUpstream) -> None:
    proxy = FaultProxy("127.0.0.1", upstream.port)
    client = _open_silent_connection(proxy, upstream)
    try:
        assert proxy.reset_all() == 1
        assert upstream.ended.wait(BOUND_SECONDS), "the upstream was never told"
        # The client's end: a reset, not an orderly end of the stream.
        with pytest.raises(ConnectionResetError):
            while client.recv(1024):
                pass
    finally:
        client.close()
        proxy.close()
