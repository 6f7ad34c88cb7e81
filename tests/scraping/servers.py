"""A real HTTP target on loopback for the fetch tests, counting what reached it.

Routes (query parameters in brackets):
- `/bytes` [n, type]: 200 with n deterministic bytes (`body_bytes(n)`) and that content type
- `/status/<code>` [retry_after]: that status with a short body (and a Retry-After)
- `/flaky/<key>` [failures]: 503 the first `failures` (2) times per key, then 200
- `/hang` [seconds]: answers nothing for that long, then 200
- `/slow` [seconds, n]: 200 with n bytes after that long (the latency of a real target)
- `/trickle` [n, interval, framing, where]: one byte every `interval` seconds, of the body
  (`where=body`) or of the status line (`where=head`)
- `/big` [n, framing]: n bytes framed by `length` (Content-Length), `close` (none, the
  connection closes) or `chunked`
- `/gzip` [n]: n zero bytes gzip-compressed, `Content-Encoding: gzip`
- `/redirect` [to, status]: a redirect to `to`; `/redirect-chain/<k>`: k hops to /bytes
- `/no-location`: 302 without a Location header
- `/short` [n]: declares n bytes, sends half, closes
- `/garbage`: a status line that is not HTTP
- `/drop`: closes the connection without answering
- `/echo`: 200 with the request target (path and query) as the body
- `/headers`: 200 with the request's headers as the body
- `/cookie`: 200 setting a cookie

Every server counts accepted TCP connections (before any byte is read) and requests.
With `tls` (see `make_tls_files`) it speaks HTTPS and records the SNI names it was sent.
"""

from __future__ import annotations

import datetime
import gzip
import hashlib
import ipaddress
import socket
import ssl
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def body_bytes(n: int) -> bytes:
    """n bytes that are not all alike, so a wrong offset changes the hash."""
    block = hashlib.sha256(b"pin").digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # 600 clients connect at once in the concurrency test; the default backlog of 5 would
    # make most of them wait for SYN retransmits.
    request_queue_size = 2048
    target: TargetServer

    def get_request(self) -> tuple[socket.socket, Any]:
        request = super().get_request()
        self.target._count_connection()
        return request


class TlsFiles(NamedTuple):
    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throw-away CA and a certificate it signed for `localhost` and 127.0.0.1."""
    now = datetime.datetime.now(datetime.UTC)

    def certificate(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: Any, ca: bool
    ) -> x509.Certificate:
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


class TargetServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, tls: TlsFiles | None = None) -> None:
        self.host = host
        self.scheme = "https" if tls else "http"
        self.sni_names: list[str | None] = []
        self._lock = threading.Lock()
        self._accepted = 0
        self._paths: list[str] = []
        self._in_flight = 0
        self.peak_in_flight = 0
        self._flaky: Counter[str] = Counter()
        # Set at close: handlers that hang or trickle stop at once.
        self.closing = threading.Event()
        self._server = _Server((host, port), _Handler)
        self._server.target = self
        self.port = self._server.server_address[1]
        if tls is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(tls.cert, tls.key)
            context.sni_callback = self._record_sni
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def url(self, path: str = "/") -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"

    @property
    def accepted_connections(self) -> int:
        with self._lock:
            return self._accepted

    @property
    def requests(self) -> list[str]:
        with self._lock:
            return list(self._paths)

    def close(self) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> TargetServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _record_sni(self, _: ssl.SSLSocket, name: str | None, __: ssl.SSLContext) -> None:
        with self._lock:
            self.sni_names.append(name)

    def _count_connection(self) -> None:
        with self._lock:
            self._accepted += 1

    def _count_request(self, path: str) -> None:
        with self._lock:
            self._paths.append(path)

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self._in_flight)

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _flaky_hit(self, key: str) -> int:
        with self._lock:
            self._flaky[key] += 1
            return self._flaky[key]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        target = self.server.target
        target._count_request(self.path)
        target._enter()
        try:
            self._route(target)
        except (BrokenPipeError, ConnectionResetError):
            # The client gave up (deadline, body limit, cancellation): nothing to answer.
            self.close_connection = True
        finally:
            target._leave()

    def _route(self, target: TargetServer) -> None:
        parts = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        path = parts.path
        if path == "/bytes":
            self._answer(200, body_bytes(int(query.get("n", "0"))), query.get("type"))
        elif path.startswith("/status/"):
            headers = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self._answer(int(path.removeprefix("/status/")), b"status", "text/plain", headers)
        elif path.startswith("/flaky/"):
            hit = target._flaky_hit(path)
            if hit <= int(query.get("failures", "2")):
                self._answer(503, b"try later", "text/plain")
            else:
                self._answer(200, b"finally", "text/plain")
        elif path in ("/hang", "/slow"):
            target.closing.wait(float(query.get("seconds", "5")))
            self._answer(200, body_bytes(int(query.get("n", "4"))), "application/octet-stream")
        elif path == "/trickle":
            self._trickle(target, query)
        elif path == "/big":
            self._big(int(query["n"]), query.get("framing", "length"))
        elif path == "/gzip":
            packed = gzip.compress(bytes(int(query["n"])))
            self._answer(200, packed, "application/octet-stream", {"Content-Encoding": "gzip"})
        elif path == "/redirect":
            status = int(query.get("status", "302"))
            self._answer(status, b"", None, {"Location": query["to"]})
        elif path.startswith("/redirect-chain/"):
            left = int(path.removeprefix("/redirect-chain/"))
            location = f"/redirect-chain/{left - 1}" if left > 1 else "/bytes?n=3"
            self._answer(302, b"", None, {"Location": location})
        elif path == "/no-location":
            self._answer(302, b"no location", "text/plain")
        elif path == "/short":
            n = int(query["n"])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.wfile.write(body_bytes(n // 2))
            self.close_connection = True
        elif path == "/garbage":
            self.wfile.write(b"THIS IS NOT HTTP\r\n\r\n")
            self.close_connection = True
        elif path == "/drop":
            self.close_connection = True
        elif path == "/echo":
            self._answer(200, self.path.encode(), "text/plain")
        elif path == "/headers":
            self._answer(200, str(self.headers).encode(), "text/plain")
        elif path == "/cookie":
            self._answer(200, b"", None, {"Set-Cookie": "session=tenant-a; Path=/"})
        else:
            self._answer(404, b"no such route", "text/plain")

    def _answer(
        self,
        status: int,
        body: bytes,
        content_type: str | None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _trickle(self, target: TargetServer, query: dict[str, str]) -> None:
        n = int(query.get("n", "100"))
        interval = float(query.get("interval", "0.05"))
        if query.get("where", "body") == "head":
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok":
                if target.closing.wait(interval):
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
            return
        framing = query.get("framing", "length")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        if framing == "length":
            self.send_header("Content-Length", str(n))
        else:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()
        for _ in range(n):
            if target.closing.wait(interval):
                return
            self.wfile.write(b"x")
            self.wfile.flush()

    def _big(self, n: int, framing: str) -> None:
        body = body_bytes(n)
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if framing == "length":
            self.send_header("Content-Length", str(n))
            self.end_headers()
            self.wfile.write(body)
        elif framing == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for start in range(0, n, 16384):
                chunk = body[start : start + 16384]
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
