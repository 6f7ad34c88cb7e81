"""A loopback TCP proxy that can be cut, slowed, hung or made to reset connections.

The fault suite puts one in front of every remote side a job talks to (the selections
API, Kafka's mock cluster, the S3 server, the scraping target, the webhook receiver), so a
fault is a method call on the proxy, not a change to the service or to the machine.

Modes, switched at any time (they apply to new connections and to data still flowing):
- `pass`: forward both ways;
- `down`: refuse: the listening socket is closed, so a connect gets ECONNREFUSED;
- `hang`: accept and read, never forward and never answer (a client's timeout fires);
- `slow`: forward, sleeping `delay_seconds` before each chunk;
- `reset`: accept, then close with SO_LINGER 0 (the client sees ECONNRESET).
`reset_all()` resets every live connection once, whatever the mode.

Every thread is a daemon and `close()` (or leaving the `with` block) stops them all; a
proxy never outlives the process that made it.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
import weakref
from types import TracebackType
from typing import Literal

log = logging.getLogger(__name__)

Mode = Literal["pass", "down", "hang", "slow", "reset"]
_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close with an RST instead of a FIN. The read side is shut first: a thread blocked
    reading the socket holds it open past close() (no RST leaves until that read returns,
    which on a silent connection is never); the shutdown wakes it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy:
    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        upstream_unix_socket: str | None = None,
    ) -> None:
        """Forward loopback TCP to `upstream_host:upstream_port`, or to the Unix socket
        `upstream_unix_socket` when given (a server listening on a socket only)."""
        if not listen_host.startswith("127."):
            raise ValueError(f"listen_host {listen_host!r}: the fault proxy listens on loopback")
        self.upstream = (upstream_host, upstream_port)
        self.upstream_unix_socket = upstream_unix_socket
        self._listen_host = listen_host
        self._mode: Mode = "pass"
        self.delay_seconds = 0.0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._resetting: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._closed = threading.Event()
        self.connections_accepted = 0
        self._listener = self._bind(listen_port)
        self.port: int = self._listener.getsockname()[1]
        self._accept_thread = self._start_accepting()

    # -- faults -------------------------------------------------------------------------
    @property
    def mode(self) -> Mode:
        return self._mode

    def set_mode(self, mode: Mode, *, delay_seconds: float = 0.0) -> None:
        with self._lock:
            previous, self._mode = self._mode, mode
            self.delay_seconds = delay_seconds
        if mode == "down" and previous != "down":
            self._stop_listening()
            self.reset_all()
        elif mode != "down" and previous == "down":
            self._listener = self._bind(self.port)
            self._accept_thread = self._start_accepting()
        log.info("proxy :%d -> %s:%d now %s", self.port, *self.upstream, mode)

    def reset_all(self) -> int:
        """Reset every live connection (both ends); returns how many."""
        with self._lock:
            conns, self._conns = list(self._conns), set()
            # A pipe woken by the reset must not end its other side with a FIN first.
            self._resetting.update(conns)
        for sock in conns:
            _reset(sock)
        return len(conns) // 2

    @property
    def address(self) -> str:
        return f"{self._listen_host}:{self.port}"

    # -- plumbing -----------------------------------------------------------------------
    def _bind(self, port: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._listen_host, port))
        listener.listen(128)
        listener.settimeout(0.2)
        return listener

    def _start_accepting(self) -> threading.Thread:
        listener = self._listener
        thread = threading.Thread(target=self._accept_loop, args=(listener,), daemon=True)
        thread.start()
        return thread

    def _stop_listening(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.close()
        self._accept_thread.join(timeout=2)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed: mode "down" or close()
            self.connections_accepted += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        mode = self._mode
        if mode == "reset":
            _reset(client)
            return
        if mode == "hang":
            self._track(client)
            self._drain_until_closed(client)
            return
        try:
            upstream = self._connect_upstream()
        except OSError:
            _reset(client)
            return
        upstream.settimeout(None)
        self._track(client, upstream)
        outbound = threading.Thread(target=self._pipe, args=(client, upstream), daemon=True)
        outbound.start()
        self._pipe(upstream, client)
        outbound.join()
        self._forget(client)
        self._forget(upstream)

    def _connect_upstream(self) -> socket.socket:
        if self.upstream_unix_socket is None:
            return socket.create_connection(self.upstream, timeout=5)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.settimeout(5)
        try:
            upstream.connect(self.upstream_unix_socket)
        except OSError:
            upstream.close()
            raise
        return upstream

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._conns.update(socks)

    def _drain_until_closed(self, sock: socket.socket) -> None:
        sock.settimeout(0.5)
        while not self._closed.is_set():
            try:
                if not sock.recv(_CHUNK):
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        self._forget(sock)

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                data = source.recv(_CHUNK)
                if not data:
                    break
                while self._mode == "hang" and not self._closed.is_set():
                    time.sleep(0.05)  # held: neither forwarded nor answered
                if self._mode == "slow" and self.delay_seconds:
                    time.sleep(self.delay_seconds)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            # Pass the end on (a FIN for a FIN); the other direction may still flow.
            if sink not in self._resetting:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._conns.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        self._closed.set()
        self._stop_listening()
        self.reset_all()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
