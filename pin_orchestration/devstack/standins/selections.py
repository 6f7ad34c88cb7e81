"""A local stand-in for the selections internal API, on 127.0.0.1 only.

Started by `pin up` when PIN_SELECTIONS_URL is unset (so the detach job is seen working
end to end), by the tests' end-to-end checks and by the benchmark. It keeps what a real
selections guarantees for the worker: detach is idempotent (a second detach of the same
snapshot is a no-op 2xx, INV-SNP-005). It can be told to fail:

    POST /admin/fail     {"status": 503, "count": 10}   next 10 detaches answer 503
                         {"status": 503}                 every detach answers 503
    POST /admin/recover                                  answer normally again
    GET  /admin/state                                    detached count, failure mode
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pin_orchestration.platform.settings import LOCAL_SELECTIONS_PORT

DEFAULT_PORT = LOCAL_SELECTIONS_PORT
_DETACH = re.compile(r"^/internal/snapshots/([0-9a-fA-F-]{36})/detach$")


class SelectionsStandIn:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        latency_seconds: float = 0.0,
    ) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the selections stand-in listens on loopback only (got {host!r})")
        self.token = token
        self.latency_seconds = latency_seconds
        self.detached: set[str] = set()
        self.calls = 0
        self._fail_status: int | None = None
        self._fail_remaining: int | None = None
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> SelectionsStandIn:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="selections-stand-in", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> SelectionsStandIn:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def fail(self, status: int = 503, count: int | None = None) -> None:
        with self._lock:
            self._fail_status, self._fail_remaining = status, count

    def recover(self) -> None:
        with self._lock:
            self._fail_status, self._fail_remaining = None, None

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {
                "detached": len(self.detached),
                "calls": self.calls,
                "fail_status": self._fail_status,
                "fail_remaining": self._fail_remaining,
            }

    def detach(self, snapshot_id: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.calls += 1
            if self._fail_status is not None:
                status = self._fail_status
                if self._fail_remaining is not None:
                    self._fail_remaining -= 1
                    if self._fail_remaining <= 0:
                        self._fail_status, self._fail_remaining = None, None
                return status, {"error": "told to fail"}
        if self.latency_seconds:
            time.sleep(self.latency_seconds)
        with self._lock:
            already = snapshot_id in self.detached
            self.detached.add(snapshot_id)
        return 200, {
            "snapshotId": snapshot_id,
            "status": "AlreadyDetached" if already else "Detached",
        }


def _handler_for(stand_in: SelectionsStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a pooled client expects
        # Headers and body go out in two writes: without TCP_NODELAY the second waits for
        # the client's delayed ACK (~40 ms a request).
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else {}
            except ValueError:
                return {}

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/admin/state":
                self._send(200, stand_in.state())
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            body = self._body()
            match = _DETACH.match(self.path)
            if match:
                if (
                    stand_in.token
                    and self.headers.get("Authorization") != f"Bearer {stand_in.token}"
                ):
                    self._send(401, {"error": "m2m token required"})
                    return
                self._send(*stand_in.detach(match.group(1).lower()))
            elif self.path == "/admin/fail":
                stand_in.fail(int(body.get("status", 503)), body.get("count"))
                self._send(200, stand_in.state())
            elif self.path == "/admin/recover":
                stand_in.recover()
                self._send(200, stand_in.state())
            else:
                self._send(404, {"error": "not found"})

    return Handler
