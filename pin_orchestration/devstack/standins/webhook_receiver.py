"""A webhook receiver on loopback that records every POST it gets (headers and body) and
answers `status`: what a client's `callback_url` looks like to the delivery loop, and the
independent record of what was delivered (tests, the fault suite)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A webhook receiver on loopback: records every POST, answers `status` (with `headers`)."""

    def __init__(self, port: int = 0) -> None:
        self.received: list[Received] = []
        self.status = 204
        # Extra headers of every answer (a receiver's 429 with Retry-After).
        self.headers: dict[str, str] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    receiver.received.append(Received(dict(self.headers.items()), body))
                    status, headers = receiver.status, dict(receiver.headers)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        class Server(ThreadingHTTPServer):
            # The default backlog of 5 makes concurrent deliveries wait for SYN retransmits.
            request_queue_size = 128

        self._server = Server(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [json.loads(r.body) for r in self.received]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
