"""A small target site on loopback for the demo (`pin up`) and end-to-end checks.

    GET /page/<name>          200, a small HTML page
    GET /missing/<name>       404
    GET /flaky/<name>?fail=2  503 (Retry-After: 1) the first `fail` times for <name>, then 200
    GET /slow/<name>?ms=2000&bytes=10240   200 after ms milliseconds, `bytes` bytes of body
    GET /script/<name>?steps=sleep,503,200  the n-th request for <name> plays the n-th step
                              (a status code, or `sleep`: hang 5 s); the last step repeats
    GET /status/<code>?retry_after=S   that status, with Retry-After when given
    GET /redirect?to=URL      302 to URL

It listens on 127.0.0.1 only; scripts/run allows 127.0.0.1/32 for the scraper so the demo
jobs reach it (every other private address stays refused).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

DEFAULT_PORT = 8791


@dataclass(frozen=True)
class Served:
    """One answer the site sent: the site's own record of what a scraper was given."""

    path: str  # without the query
    status: int
    sha256: str  # of the body sent
    arrived: float  # time.monotonic() when the request was read
    answered: float  # ... and when the answer was written


SERVED_LOG_LIMIT = 100_000


class DemoSite:
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the demo site listens on loopback only (got {host!r})")
        self.requests: Counter[str] = Counter()
        # Requests being answered right now per Host name, and the most at once: what a
        # politeness limit promises a site (two names of this server count apart).
        self.in_flight: Counter[str] = Counter()
        self.peak_in_flight: Counter[str] = Counter()
        # The site's own record of its answers (the fault suite checks results against it),
        # bounded so a long-running `pin up` demo does not grow it forever.
        self.served: deque[Served] = deque(maxlen=SERVED_LOG_LIMIT)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._server.request_queue_size = 1024

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> DemoSite:
        threading.Thread(
            target=self._server.serve_forever, name="scraping-demo-site", daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def count(self, path: str) -> int:
        with self._lock:
            self.requests[path] += 1
            return self.requests[path]

    def record(self, served: Served) -> None:
        with self._lock:
            self.served.append(served)

    def _enter(self, host: str) -> None:
        with self._lock:
            self.in_flight[host] += 1
            self.peak_in_flight[host] = max(self.peak_in_flight[host], self.in_flight[host])

    def _leave(self, host: str) -> None:
        with self._lock:
            self.in_flight[host] -= 1


def _handler_for(site: DemoSite) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
            self.arrived = time.monotonic()
            site._enter(host)
            try:
                self._serve()
            finally:
                site._leave(host)

        def _serve(self) -> None:
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            seen = site.count(parts.path)
            kind = parts.path.strip("/").split("/", 1)[0]
            if kind == "page":
                body = (
                    f"<html><head><title>{parts.path}</title></head>"
                    f"<body><h1>demo page {parts.path}</h1><p>query {parts.query}</p>"
                    "</body></html>"
                ).encode()
                self._answer(200, body, "text/html; charset=utf-8")
            elif kind == "flaky" and seen <= int(query.get("fail", ["2"])[0]):
                self._answer(503, b"busy, try later\n", "text/plain", {"Retry-After": "1"})
            elif kind == "flaky":
                self._answer(200, f"recovered after {seen - 1} failures\n".encode(), "text/plain")
            elif kind == "script":
                steps = query.get("steps", ["200"])[0].split(",")
                step = steps[min(seen, len(steps)) - 1]
                if step == "sleep":
                    time.sleep(5)
                    step = "200"
                self._answer(int(step), f"step {seen}: {step}\n".encode(), "text/plain")
            elif kind == "status":
                code = int(parts.path.strip("/").split("/")[1])
                extra = {"Retry-After": query["retry_after"][0]} if "retry_after" in query else {}
                self._answer(code, f"status {code}\n".encode(), "text/plain", extra)
            elif kind == "redirect":
                self._answer(302, b"", "text/plain", {"Location": query["to"][0]})
            elif kind == "slow":
                time.sleep(int(query.get("ms", ["2000"])[0]) / 1000)
                size = int(query.get("bytes", ["10240"])[0])
                self._answer(200, b"x" * size, "application/octet-stream")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _answer(
            self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
        ) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)
            site.record(
                Served(
                    urlsplit(self.path).path,
                    status,
                    hashlib.sha256(body).hexdigest(),
                    self.arrived,
                    time.monotonic(),
                )
            )

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler
