"""Size limits of the API's requests, enforced before the app reads anything (issue 11).

- Headers over `max_header_bytes` in all (each counted as `name: value\\r\\n`) → 431.
  uvicorn's default HTTP parser (httptools) has no header limit of its own, and h11's
  only cuts the connection; this gives clients a clear answer naming the limit. (The
  header block itself is read by the server before the app is called: a proxy in front
  — nginx `large_client_header_buffers` — bounds that memory.)
- A body over `max_body_bytes` → 413: at once from its Content-Length, without reading it;
  a chunked body (no Content-Length) is counted as it streams and cut at the limit, so no
  request makes the app hold more than the limit plus one chunk. Whatever the app was
  doing with the body is discarded and the 413 sent instead.

Both answers close the connection (`Connection: close`): the rest of an oversized body is
never read.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pin_orchestration.scraping.api.problems import MEDIA_TYPE, problem_body

MAX_BODY_BYTES = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024
# POST /jobs/batch: up to 1,000 jobs of ~2 KiB each on average.
MAX_BATCH_BODY_BYTES = 2 * 1024 * 1024


class _BodyTooLarge(Exception):
    pass


class RequestSizeLimits:
    """ASGI middleware: 413 for a body over `max_body_bytes`, 431 for headers over
    `max_header_bytes`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_header_bytes: int = MAX_HEADER_BYTES,
        body_bytes_by_path: dict[str, int] | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_header_bytes = max_header_bytes
        # Paths allowed another body limit than max_body_bytes (the batch intake).
        self.body_bytes_by_path = body_bytes_by_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header_bytes = sum(len(name) + len(value) + 4 for name, value in scope["headers"])
        if header_bytes > self.max_header_bytes:
            await _answer(
                send,
                431,
                f"the request's headers are {header_bytes} bytes; at most "
                f"{self.max_header_bytes} bytes of headers are accepted",
            )
            return
        max_body_bytes = self.body_bytes_by_path.get(scope["path"], self.max_body_bytes)
        declared = _content_length(scope)
        if declared is not None and declared > max_body_bytes:
            await _answer(send, 413, _too_large(f"declared {declared} bytes", max_body_bytes))
            return

        received = 0
        too_large = False
        started = False

        async def counted_receive() -> Message:
            nonlocal received, too_large
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body_bytes:
                    too_large = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if too_large:
                return  # the app's answer to a cut body is replaced by the 413
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not too_large:
                raise
        if too_large and not started:
            await _answer(
                send, 413, _too_large(f"more than {max_body_bytes} bytes", max_body_bytes)
            )


def _too_large(what: str, max_body_bytes: int) -> str:
    return (
        f"the request body is {what}; at most {max_body_bytes} bytes are accepted "
        "(params at most 16384 bytes as JSON)"
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the HTTP server refuses it
    return None


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps(problem_body(status, detail)).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
