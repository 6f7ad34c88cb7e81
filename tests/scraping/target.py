"""A loopback target that records every request it serves: when it arrived, when it was
answered, and how many were open at once — politeness is measured where it matters, at
the target. Bound to one loopback address, so several of them are several domains
(127.0.0.3, 127.0.0.4, … with 127.0.0.0/8 in the scraper's allow-list).

    GET /slow?ms=300          200 after ms milliseconds
    GET /status/<code>?retry_after=S   that status, with Retry-After when given
    GET /redirect?to=URL      302 to URL
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Served:
    path: str
    arrived: float  # time.time()
    answered: float


class RecordingTarget:
    def __init__(self, host: str) -> None:
        if not host.startswith("127."):
            raise ValueError(f"test targets listen on loopback only (got {host!r})")
        self.host = host
        self.served: list[Served] = []
        self.open_now = 0
        self.most_open = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, 0), _handler_for(self))
        self._server.daemon_threads = True
        self._server.request_queue_size = 256
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self._server.server_address[1]}"

    def arrivals(self) -> list[float]:
        with self._lock:
            return sorted(s.arrived for s in self.served)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _enter(self) -> float:
        with self._lock:
            self.open_now += 1
            self.most_open = max(self.most_open, self.open_now)
        return time.time()

    def _leave(self, path: str, arrived: float) -> None:
        with self._lock:
            self.open_now -= 1
            self.served.append(Served(path, arrived, time.time()))


def _handler_for(target: RecordingTarget) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            arrived = target._enter()
            try:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                headers: dict[str, str] = {}
                status = 200
                if parts.path.startswith("/slow"):
                    time.sleep(int(query.get("ms", ["0"])[0]) / 1000)
                elif parts.path.startswith("/redirect"):
                    status = 302
                    headers["Location"] = query["to"][0]
                elif parts.path.startswith("/status/"):
                    status = int(parts.path.split("/")[2])
                    if "retry_after" in query:
                        headers["Retry-After"] = query["retry_after"][0]
                body = f"{status} {parts.path}\n".encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()
            finally:
                # Counted closed once the answer is out: the client may already be
                # writing its outcome, never before.
                target._leave(self.path, arrived)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler


class GatedTarget:
    """A loopback target that holds every request until the test opens the gate, then
    answers `status` with a body naming the request's number (so two fetches of one page
    store different bytes). `arrived` lets a test wait until N requests are held."""

    def __init__(self, host: str = "127.0.0.1", *, status: int = 200) -> None:
        if not host.startswith("127."):
            raise ValueError(f"test targets listen on loopback only (got {host!r})")
        self.status = status
        self.gate = threading.Event()
        self.paths: list[str] = []
        self._arrivals = threading.Condition()
        self._server = ThreadingHTTPServer((host, 0), _gated_handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def wait_for_requests(self, n: int, timeout: float = 30) -> None:
        with self._arrivals:
            if not self._arrivals.wait_for(lambda: len(self.paths) >= n, timeout):
                raise AssertionError(f"{len(self.paths)} requests arrived, waited for {n}")

    def stop(self) -> None:
        self.gate.set()
        self._server.shutdown()
        self._server.server_close()

    def _arrive(self, path: str) -> int:
        with self._arrivals:
            self.paths.append(path)
            self._arrivals.notify_all()
            return len(self.paths)


def _gated_handler_for(target: GatedTarget) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            number = target._arrive(self.path)
            target.gate.wait()
            body = f"answer {number} to {self.path}\n".encode()
            self.send_response(target.status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler
