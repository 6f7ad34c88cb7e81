"""The loopback target site: what `pin up`'s demo jobs fetch, and what the tests, the fault
suite and the benches point scrapers at. It records what reached it, so politeness and
results are checked where they matter, at the target.

Routes (query parameters in brackets; <name> is any path segment, counted apart):

    /page/<name>                  200, a small HTML page naming the path and query
    /bytes [n, type]              200 with n deterministic bytes (`body_bytes(n)`), that type
    /status/<code> [retry_after]  that status (with Retry-After when given)
    /flaky/<name> [fail=2]        503 (Retry-After: 1) the first `fail` times, then 200
    /slow[/<name>] [ms=2000, bytes=10240]   200 after ms milliseconds, `bytes` bytes of body
    /script/<name> [steps=200]    the n-th request plays the n-th of the comma-separated
                                  steps (a status code, or `sleep`: hang 5 s, then 200);
                                  the last step repeats
    /held/<name> [status=200]     held until the test sets `gate`, then that status with a
                                  body naming the request's number (two fetches of one page
                                  store different bytes)
    /trickle [n=100, interval=0.05, framing=length, where=body]   one byte every `interval`
                                  seconds, of the body or (`where=head`) of the status line
    /big [n, framing=length]      n bytes framed by `length` (Content-Length), `close` (none,
                                  the connection closes) or `chunked`
    /gzip [n]                     n zero bytes gzip-compressed, Content-Encoding: gzip
    /redirect [to, status=302]    a redirect to `to`
    /redirect-chain/<k>           k hops, then /bytes?n=3
    /no-location                  302 without a Location header
    /short [n]                    declares n bytes, sends half, closes
    /garbage                      a status line that is not HTTP
    /drop                         closes the connection without answering
    /echo                         200, the request target (path and query) as the body
    /headers                      200, the request's headers as the body
    /cookie                       200 setting a cookie
    /robots.txt                   what `robots` scripts: the n-th request gets its n-th
                                  (status, body, headers), the last repeats; 404 when empty;
                                  held while `robots_gate` is set and not open
    anything else                 404

It listens on loopback only (127.0.0.0/8 or `localhost`): one per address is one domain per
target (127.0.0.3, 127.0.0.4, …). scripts/run allows 127.0.0.1/32 for the scraper so the
demo jobs reach it (every other private address stays refused). With `tls` (see
`make_tls_files`) it speaks HTTPS and records the SNI names it was sent.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import ipaddress
import socket
import ssl
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

DEFAULT_PORT = 8791

# The records kept of requests and answers are bounded so a long-running `pin up` demo
# does not grow them forever.
LOG_LIMIT = 100_000


@dataclass(frozen=True)
class Served:
    """One answer the site sent in full: its own record of what a scraper was given."""

    path: str  # without the query
    status: int
    sha256: str  # of the body sent
    arrived: float  # time.time() when the request was read
    answered: float  # ... and when the answer was written


def body_bytes(n: int) -> bytes:
    """n bytes that are not all alike, so a wrong offset changes the hash."""
    block = hashlib.sha256(b"pin").digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


class TlsFiles(NamedTuple):
    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throw-away CA and a certificate it signed for `localhost` and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: Any, issuer: Any, signer: Any, ca: bool) -> Any:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pin test CA")])
    ca_cert = certificate("pin test CA", ca_key, ca_name, ca_key, ca=True)
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_cert = certificate("localhost", leaf_key, ca_name, ca_key, ca=False)
    files = TlsFiles(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    files.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(leaf_cert.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return files


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network("127.0.0.0/8")
    except ValueError:
        return False


def _is_robots(target: str) -> bool:
    return urlsplit(target).path == "/robots.txt"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # 600 clients connect at once in the fetcher's concurrency test; the default backlog
    # of 5 would make most of them wait for SYN retransmits.
    request_queue_size = 2048
    target: ScrapingTarget

    def get_request(self) -> tuple[socket.socket, Any]:
        request = super().get_request()
        self.target._count_connection()
        return request


class ScrapingTarget:
    """The site; `start()` serves it (or `with ScrapingTarget(…) as target:`)."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, tls: TlsFiles | None = None
    ) -> None:
        if not _is_loopback(host):
            raise ValueError(f"the scraping target listens on loopback only (got {host!r})")
        self.scheme = "https" if tls else "http"
        # Requests being answered right now per Host name, and the most at once: what a
        # politeness limit promises a site (two names of this server count apart); and the
        # most at once over every name.
        self.in_flight: Counter[str] = Counter()
        self.peak_in_flight: Counter[str] = Counter()
        self.most_in_flight = 0
        # The site's own record of the answers it sent in full (the fault suite checks
        # results against it).
        self.served: deque[Served] = deque(maxlen=LOG_LIMIT)
        self.sni_names: list[str | None] = []
        # /robots.txt answers, in order (the last repeats); none: 404, as for any path.
        self.robots: list[tuple[int, str, dict[str, str]]] = []
        # When set, /robots.txt answers wait for this event (a test's gate).
        self.robots_gate: threading.Event | None = None
        # /held/ answers wait for this; set at stop.
        self.gate = threading.Event()
        # Set at stop: handlers that hang, sleep or trickle stop at once.
        self.closing = threading.Event()
        self._lock = threading.Condition()
        self._accepted = 0
        self._arrived = 0
        self._requests: deque[str] = deque(maxlen=LOG_LIMIT)
        self._hits: Counter[str] = Counter()
        self._server = _Server((host, port), _Handler)
        self._server.target = self
        self.host, self.port = self._server.server_address[:2]
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls.cert, tls.key)
            context.sni_callback = self._record_sni
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"

    def start(self) -> ScrapingTarget:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scraping-target",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.closing.set()
        self.gate.set()
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()

    def __enter__(self) -> ScrapingTarget:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def requests(self) -> list[str]:
        """Every request's target (path and query), in the order they arrived, but those of
        /robots.txt (the scraper asks for it before a host's first job: `count` and
        `all_requests` show them)."""
        with self._lock:
            return [r for r in self._requests if not _is_robots(r)]

    @property
    def all_requests(self) -> list[str]:
        """Every request's target, /robots.txt included, in the order they arrived."""
        with self._lock:
            return list(self._requests)

    def count(self, path: str) -> int:
        """How many requests reached `path` (without the query)."""
        with self._lock:
            return self._hits[path]

    @property
    def accepted_connections(self) -> int:
        """TCP connections accepted, before any byte was read."""
        with self._lock:
            return self._accepted

    def arrivals(self) -> list[float]:
        """When each answer sent in full arrived, sorted (/robots.txt's not: `served` keeps
        the answers to jobs)."""
        with self._lock:
            return sorted(s.arrived for s in self.served)

    def wait_for_requests(self, n: int, timeout: float = 30) -> None:
        """Until `n` requests other than /robots.txt have arrived."""
        with self._lock:
            if not self._lock.wait_for(lambda: self._arrived >= n, timeout):
                raise AssertionError(f"{self._arrived} requests arrived, waited for {n}")

    def _record_sni(self, _: ssl.SSLSocket, name: str | None, __: ssl.SSLContext) -> None:
        with self._lock:
            self.sni_names.append(name)

    def _count_connection(self) -> None:
        with self._lock:
            self._accepted += 1

    def _arrive(self, target: str, path: str, host: str) -> tuple[int, int]:
        """Count a request in; returns its number at this site and at its path."""
        with self._lock:
            if not _is_robots(target):
                self._arrived += 1
            self._requests.append(target)
            self._hits[path] += 1
            self.in_flight[host] += 1
            self.peak_in_flight[host] = max(self.peak_in_flight[host], self.in_flight[host])
            self.most_in_flight = max(self.most_in_flight, sum(self.in_flight.values()))
            self._lock.notify_all()
            return self._arrived, self._hits[path]

    def _leave(self, host: str, served: Served | None) -> None:
        # Counted closed once the answer is out: the client may already be writing its
        # outcome, never before.
        with self._lock:
            if served is not None and not _is_robots(served.path):
                self.served.append(served)
            self.in_flight[host] -= 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        site = self.server.target
        parts = urlsplit(self.path)
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0]
        arrived = time.time()
        self._status = 0
        self._sha = hashlib.sha256()
        number, seen = site._arrive(self.path, parts.path, host)
        served = None
        try:
            self._route(site, parts.path, parts.query, number, seen)
            self.wfile.flush()
            if self._status:  # an HTTP answer went out in full
                served = Served(
                    parts.path, self._status, self._sha.hexdigest(), arrived, time.time()
                )
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (deadline, body limit, cancellation): nothing to answer.
            self.close_connection = True
        finally:
            site._leave(host, served)

    def _route(
        self, site: ScrapingTarget, path: str, raw_query: str, number: int, seen: int
    ) -> None:
        query = {key: values[-1] for key, values in parse_qs(raw_query).items()}
        segments = path.strip("/").split("/")
        kind = segments[0]
        if kind == "page":
            body = (
                f"<html><head><title>{path}</title></head>"
                f"<body><h1>demo page {path}</h1><p>query {raw_query}</p>"
                "</body></html>"
            ).encode()
            self._answer(200, body, "text/html; charset=utf-8")
        elif kind == "bytes":
            self._answer(200, body_bytes(int(query.get("n", "0"))), query.get("type"))
        elif kind == "status":
            code = int(segments[1])
            headers = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self._answer(code, f"status {code}\n".encode(), "text/plain", headers)
        elif kind == "flaky" and seen <= int(query.get("fail", "2")):
            self._answer(503, b"busy, try later\n", "text/plain", {"Retry-After": "1"})
        elif kind == "flaky":
            self._answer(200, f"recovered after {seen - 1} failures\n".encode(), "text/plain")
        elif kind == "slow":
            site.closing.wait(int(query.get("ms", "2000")) / 1000)
            size = int(query.get("bytes", "10240"))
            self._answer(200, b"x" * size, "application/octet-stream")
        elif kind == "script":
            steps = query.get("steps", "200").split(",")
            step = steps[min(seen, len(steps)) - 1]
            if step == "sleep":
                site.closing.wait(5)
                step = "200"
            self._answer(int(step), f"step {seen}: {step}\n".encode(), "text/plain")
        elif kind == "held":
            site.gate.wait()
            status = int(query.get("status", "200"))
            self._answer(status, f"answer {number} to {self.path}\n".encode(), "text/plain")
        elif kind == "trickle":
            self._trickle(site, query)
        elif kind == "big":
            self._big(int(query["n"]), query.get("framing", "length"))
        elif kind == "gzip":
            packed = gzip.compress(bytes(int(query["n"])))
            self._answer(200, packed, "application/octet-stream", {"Content-Encoding": "gzip"})
        elif kind == "redirect":
            status = int(query.get("status", "302"))
            self._answer(status, b"", None, {"Location": query["to"]})
        elif kind == "redirect-chain":
            left = int(segments[1])
            location = f"/redirect-chain/{left - 1}" if left > 1 else "/bytes?n=3"
            self._answer(302, b"", None, {"Location": location})
        elif kind == "no-location":
            self._answer(302, b"no location", "text/plain")
        elif kind == "short":
            n = int(query["n"])
            self._head(200, {"Content-Length": str(n)})
            self._body(body_bytes(n // 2))
            self.close_connection = True
        elif kind == "garbage":
            self._body(b"THIS IS NOT HTTP\r\n\r\n")
            self.close_connection = True
        elif kind == "drop":
            self.close_connection = True
        elif kind == "echo":
            self._answer(200, self.path.encode(), "text/plain")
        elif kind == "headers":
            self._answer(200, str(self.headers).encode(), "text/plain")
        elif path == "/robots.txt" and site.robots:
            while site.robots_gate is not None and not site.robots_gate.wait(0.05):
                if site.closing.is_set():
                    break
            status, text, headers = site.robots[min(seen, len(site.robots)) - 1]
            self._answer(status, text.encode(), "text/plain", headers)
        elif kind == "cookie":
            self._answer(200, b"", None, {"Set-Cookie": "session=tenant-a; Path=/"})
        else:
            self._answer(404, b"not found\n", "text/plain")

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self._status = status
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()

    def _body(self, data: bytes) -> None:
        self._sha.update(data)
        self.wfile.write(data)

    def _answer(
        self,
        status: int,
        body: bytes,
        content_type: str | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        head = {"Content-Type": content_type} if content_type is not None else {}
        head.update(headers or {})
        head["Content-Length"] = str(len(body))
        self._head(status, head)
        self._body(body)

    def _trickle(self, site: ScrapingTarget, query: dict[str, str]) -> None:
        n = int(query.get("n", "100"))
        interval = float(query.get("interval", "0.05"))
        if query.get("where", "body") == "head":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
                if site.closing.wait(interval):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            return
        if query.get("framing", "length") == "length":
            self._head(200, {"Content-Type": "text/plain", "Content-Length": str(n)})
        else:
            self._head(200, {"Content-Type": "text/plain", "Connection": "close"})
            self.close_connection = True
        self.wfile.flush()
        for _ in range(n):
            if site.closing.wait(interval):
                return
            self._body(b"x")
            self.wfile.flush()

    def _big(self, n: int, framing: str) -> None:
        body = body_bytes(n)
        head = {"Content-Type": "application/octet-stream"}
        if framing == "length":
            self._head(200, {**head, "Content-Length": str(n)})
            self._body(body)
        elif framing == "chunked":
            self._head(200, {**head, "Transfer-Encoding": "chunked"})
            for start in range(0, n, 16384):
                chunk = body[start : start + 16384]
                self.wfile.write(f"{len(chunk):x}\r\n".encode())
                self._body(chunk)
                self.wfile.write(b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._head(200, {**head, "Connection": "close"})
            self._body(body)
            self.close_connection = True
