"""A hostile HTTP peer on loopback: a scraping target and a webhook receiver that answer
with malformed HTTP, for the tests and the fault suite (`scraping-hostile-peer`).

Every request is answered by the behaviour its first path segment names, `/<behaviour>/
<name>[?hop=N]` (GET and POST alike: the scraper fetches it, the delivery loop posts to
it), from `CORPUS`: bad and huge headers, absurd Content-Length, Retry-After and dates,
redirect loops and host flips, truncated and endless bodies, slow drips, resets, invalid
status lines. It writes raw bytes on a plain socket, so nothing in an HTTP library
between it and the client tidies the answer up.

The peer keeps its own record of every request it read (`requests`): the fault suite
counts the attempts a job made at it there, independently of the job's bookkeeping. A
redirect's Location carries `hop=N`, so a fetch's first request is told from its hops.
"""

from __future__ import annotations

import contextlib
import gzip
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from urllib.parse import parse_qs, urlsplit

# Bounds of what the peer reads of a request: it is hostile, not a victim.
_MAX_HEAD_BYTES = 64 * 1024
_MAX_BODY_BYTES = 1024 * 1024
# How long a drip or an endless answer goes on at most when the client does not give up
# (it always should: the fetch has a deadline).
_ENDLESS_SECONDS = 120.0
_DRIP_INTERVAL_SECONDS = 0.1


@dataclass(frozen=True)
class PeerRequest:
    """One request the peer read: its own record, independent of the client's."""

    method: str
    path: str  # without the query
    behaviour: str
    name: str  # the path after the behaviour (a job's own name)
    first_hop: bool  # not a request a redirect of ours led to
    arrived: float  # time.time()
    body: bytes


class _Answer:
    """What a behaviour writes with: the connection, and whether the peer is stopping."""

    def __init__(self, sock: socket.socket, peer: HostilePeer, request: PeerRequest, hop: int):
        self.sock = sock
        self.peer = peer
        self.request = request
        self.hop = hop

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def head(self, status_line: str, *headers: str, end: bool = True) -> None:
        lines = [status_line, *headers]
        self.send(("\r\n".join(lines) + "\r\n" + ("\r\n" if end else "")).encode("latin-1"))

    def drip(self, data: bytes) -> None:
        """`data` one byte at a time, a pause between bytes, until it is sent or the client
        has gone (a write fails) or the peer stops."""
        for i in range(len(data)):
            if self.peer.stopping.wait(_DRIP_INTERVAL_SECONDS):
                return
            self.send(data[i : i + 1])

    def forever(self, chunk: bytes, interval: float = 0.0) -> None:
        """`chunk` again and again until the client goes away (the write fails) or the
        peer stops; bounded by `_ENDLESS_SECONDS` all the same."""
        ends = time.monotonic() + _ENDLESS_SECONDS
        while time.monotonic() < ends and not self.peer.stopping.is_set():
            self.send(chunk)
            if interval:
                self.peer.stopping.wait(interval)

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), not a FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def location(self, host: str | None = None) -> str:
        """This request's own URL on `host` (this peer's by default), one hop further."""
        host = host or self.peer.host
        path = f"/{self.request.behaviour}/{self.request.name}"
        return f"http://{host}:{self.peer.port}{path}?hop={self.hop + 1}"


Behaviour = Callable[[_Answer], None]


@cache
def _gzip_bomb() -> bytes:
    # 64 MiB of zeros in ~64 KiB: past any sane body limit once decoded.
    return gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)


def _ok(a: _Answer) -> None:
    a.head("HTTP/1.1 200 OK", "Content-Length: 2", "Connection: close")
    a.send(b"ok")


CORPUS: dict[str, Behaviour] = {
    # The control: a well-formed answer.
    "ok": _ok,
    # Content-Length that is not a length: str.isdigit() is true for "²", int() refuses it.
    "content-length-superscript": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: ²", "Connection: close"),
        a.send(b"x"),
    ),
    "content-length-negative": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: -5", "Connection: close"),
        a.send(b"hello"),
    ),
    "content-length-huge": lambda a: (
        a.head("HTTP/1.1 200 OK", f"Content-Length: {10**40}", "Connection: close"),
        a.send(b"tiny"),
    ),
    "content-length-twice": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: 3", "Content-Length: 7", "Connection: close"),
        a.send(b"abcdefg"),
    ),
    "content-length-hex": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: 0x10", "Connection: close"),
        a.send(b"0123456789abcdef"),
    ),
    # Headers: one of a megabyte, twenty thousand of them, a line with no colon, NULs,
    # and headers that never end.
    "huge-header": lambda a: (
        a.head("HTTP/1.1 200 OK", "X-Pad: " + "a" * (1024 * 1024), "Content-Length: 2"),
        a.send(b"ok"),
    ),
    "many-headers": lambda a: (
        a.head("HTTP/1.1 200 OK", *(f"X-H-{i}: v" for i in range(20000)), "Content-Length: 2"),
        a.send(b"ok"),
    ),
    "header-without-colon": lambda a: (
        a.head("HTTP/1.1 200 OK", "this is not a header", "Content-Length: 2"),
        a.send(b"ok"),
    ),
    "header-nul": lambda a: (
        a.head("HTTP/1.1 200 OK", "X-A: a\x00b\x01", "Content-Length: 2"),
        a.send(b"ok"),
    ),
    "endless-headers": lambda a: (
        a.head("HTTP/1.1 200 OK", end=False),
        a.forever(b"X-More: yes\r\n", interval=0.001),
    ),
    # Retry-After and dates no calendar has.
    "retry-after-huge": lambda a: a.head(
        "HTTP/1.1 503 Service Unavailable", f"Retry-After: {10**30}", "Content-Length: 0"
    ),
    "retry-after-superscript": lambda a: a.head(
        "HTTP/1.1 429 Too Many Requests", "Retry-After: ²", "Content-Length: 0"
    ),
    "retry-after-negative": lambda a: a.head(
        "HTTP/1.1 503 Service Unavailable", "Retry-After: -30", "Content-Length: 0"
    ),
    "retry-after-bad-date": lambda a: a.head(
        "HTTP/1.1 503 Service Unavailable",
        "Retry-After: Sat, 30 Feb 2026 25:61:61 GMT",
        "Content-Length: 0",
    ),
    "retry-after-year-9999": lambda a: a.head(
        "HTTP/1.1 429 Too Many Requests",
        "Retry-After: Fri, 31 Dec 9999 23:59:59 GMT",
        "Content-Length: 0",
    ),
    "retry-after-year-0": lambda a: a.head(
        "HTTP/1.1 429 Too Many Requests",
        "Retry-After: Mon, 01 Jan 0000 00:00:00 GMT",
        "Content-Length: 0",
    ),
    "absurd-dates": lambda a: (
        a.head(
            "HTTP/1.1 200 OK",
            "Date: Thu, 99 Foo 99999 99:99:99 GMT",
            "Last-Modified: -1",
            "Expires: yesterday",
            "Content-Length: 2",
            "Connection: close",
        ),
        a.send(b"ok"),
    ),
    # Redirects: to itself forever, between two names of the host, to no valid URL.
    "redirect-loop": lambda a: a.head(
        "HTTP/1.1 302 Found", f"Location: {a.location()}", "Content-Length: 0"
    ),
    "redirect-host-flip": lambda a: a.head(
        "HTTP/1.1 301 Moved Permanently",
        f"Location: {a.location(a.peer.alias if a.hop % 2 == 0 else a.peer.host)}",
        "Content-Length: 0",
    ),
    "redirect-bad-location": lambda a: a.head(
        "HTTP/1.1 302 Found", "Location: http://[::1:bad/x", "Content-Length: 0"
    ),
    # Bodies: cut short, never ending, dripping, reset halfway, badly chunked, not the
    # gzip they claim, a gzip bomb.
    "truncated-body": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: 100000", "Connection: close"),
        a.send(b"x" * 100),
    ),
    "endless-body": lambda a: (
        a.head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"),
        a.forever(b"2000\r\n" + b"y" * 0x2000 + b"\r\n"),
    ),
    "endless-body-unframed": lambda a: (
        a.head("HTTP/1.1 200 OK", "Connection: close"),
        a.forever(b"z" * 65536),
    ),
    "drip-head": lambda a: a.drip(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 100),
    "drip-body": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: 1000"),
        a.drip(b"d" * 1000),
    ),
    "reset": lambda a: a.reset(),
    "reset-mid-body": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Length: 1000"),
        a.send(b"x" * 10),
        a.reset(),
    ),
    "close-silently": lambda a: None,
    "bad-chunked": lambda a: (
        a.head("HTTP/1.1 200 OK", "Transfer-Encoding: chunked"),
        a.send(b"zz\r\nnot a chunk\r\n0\r\n\r\n"),
    ),
    "bad-gzip": lambda a: (
        a.head("HTTP/1.1 200 OK", "Content-Encoding: gzip", "Content-Length: 8"),
        a.send(b"not gzip"),
    ),
    "gzip-bomb": lambda a: (
        a.head(
            "HTTP/1.1 200 OK",
            "Content-Encoding: gzip",
            f"Content-Length: {len(_gzip_bomb())}",
            "Connection: close",
        ),
        a.send(_gzip_bomb()),
    ),
    # Status lines that are not HTTP's.
    "status-no-code": lambda a: a.send(b"HTTP/1.1 OK\r\nContent-Length: 0\r\n\r\n"),
    "status-999": lambda a: a.send(b"HTTP/1.1 999 Whatever\r\nContent-Length: 0\r\n\r\n"),
    "status-negative": lambda a: a.send(b"HTTP/1.1 -200 OK\r\nContent-Length: 0\r\n\r\n"),
    "status-not-http": lambda a: a.send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"),
    "status-100-only": lambda a: a.send(b"HTTP/1.1 100 Continue\r\n\r\n"),
    "status-http-2": lambda a: a.send(b"HTTP/2 200\r\ncontent-length: 0\r\n\r\n"),
    "binary-garbage": lambda a: a.send(bytes(range(256)) * 16),
}


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        peer = self.server.peer
        sock: socket.socket = self.request
        sock.settimeout(10)
        try:
            head, rest = _read_head(sock)
        except (OSError, ValueError):
            return
        method, target = _request_line(head)
        length = _content_length(head)
        body = rest
        with contextlib.suppress(OSError):
            while len(body) < min(length, _MAX_BODY_BYTES):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                body += chunk
        parts = urlsplit(target)
        segments = parts.path.lstrip("/").split("/", 1)
        behaviour = segments[0]
        name = segments[1] if len(segments) > 1 else ""
        hop = int((parse_qs(parts.query).get("hop") or ["0"])[0] or 0)
        request = PeerRequest(
            method, parts.path, behaviour, name, hop == 0, time.time(), body[:_MAX_BODY_BYTES]
        )
        with peer._lock:
            peer.requests.append(request)
        answer = CORPUS.get(behaviour)
        if answer is None:
            with contextlib.suppress(OSError):
                sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        with contextlib.suppress(OSError):  # the client gave up: what hostile peers see
            answer(_Answer(sock, peer, request, hop))


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > _MAX_HEAD_BYTES:
            raise ValueError("request head too large")
        chunk = sock.recv(65536)
        if not chunk:
            raise ValueError("closed before the request head ended")
        data += chunk
    head, rest = data.split(b"\r\n\r\n", 1)
    return head, rest


def _request_line(head: bytes) -> tuple[str, str]:
    first = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
    return (first[0], first[1]) if len(first) >= 2 else ("?", "/")


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            return int(value.strip())
    return 0


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256
    peer: HostilePeer


class HostilePeer:
    """The peer on a loopback port; `with HostilePeer() as peer:` or `start()`/`stop()`.
    `url(behaviour, name)` is the address that plays `behaviour` for a job named `name`.

    With `alias` (another loopback address) it listens there too, on the same port: the
    host flips of `redirect-host-flip` go back and forth between the two (without one,
    to `localhost`, which is the peer only when it listens on 127.0.0.1)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, alias: str | None = None) -> None:
        for address in (host, alias or host):
            if not address.startswith("127."):
                raise ValueError(f"the hostile peer listens on loopback only (got {address!r})")
        self.requests: list[PeerRequest] = []
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._servers = [_Server((host, port), _Handler)]
        self.host, self.port = self._servers[0].server_address[:2]
        if alias is not None:
            self._servers.append(_Server((alias, self.port), _Handler))
        self.alias = alias or "localhost"
        for server in self._servers:
            server.peer = self
        self._threads: list[threading.Thread] = []

    def url(self, behaviour: str, name: str = "x") -> str:
        if behaviour not in CORPUS:
            raise KeyError(f"no behaviour {behaviour!r} in the hostile corpus")
        return f"http://{self.host}:{self.port}/{behaviour}/{name}"

    def start(self) -> HostilePeer:
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name="hostile-peer",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self.stopping.set()
        for server in self._servers:
            if self._threads:
                server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join()

    def seen(self) -> list[PeerRequest]:
        with self._lock:
            return list(self.requests)

    def __enter__(self) -> HostilePeer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
