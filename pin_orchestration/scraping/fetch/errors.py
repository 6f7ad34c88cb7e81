"""What a fetch that got no usable answer is: a `FetchError` of a stable class, judged from
what requests and urllib3 raised."""

from __future__ import annotations

import http.client

import requests
import urllib3.exceptions

from pin_orchestration.scraping.fetch.deadline import Deadline
from pin_orchestration.scraping.fetch.guard import AddressRefusedError

FETCH_ERROR_CLASSES = frozenset(
    {
        "timeout",
        "connection_error",
        "refused_address",
        "body_too_large",
        "too_many_redirects",
        "invalid_url",
        "invalid_response",
        "cancelled",
    }
)

_MAX_DETAIL_CHARS = 300


class FetchError(Exception):
    """No usable answer. `error_class` is one of `FETCH_ERROR_CLASSES`, stable for the
    retry planner and the attempts list; `detail` is short human text."""

    def __init__(self, error_class: str, detail: str) -> None:
        if error_class not in FETCH_ERROR_CLASSES:
            raise ValueError(f"unknown fetch error class {error_class!r}")
        super().__init__(f"{error_class}: {detail}")
        self.error_class = error_class
        self.detail = detail


_INVALID_URL_ERRORS = (
    requests.exceptions.InvalidURL,
    requests.exceptions.MissingSchema,
    requests.exceptions.InvalidSchema,
    requests.exceptions.URLRequired,
    urllib3.exceptions.LocationValueError,
)
_INVALID_RESPONSE_ERRORS = (
    urllib3.exceptions.InvalidChunkLength,
    urllib3.exceptions.DecodeError,
    urllib3.exceptions.InvalidHeader,
    urllib3.exceptions.ResponseNotChunked,
    requests.exceptions.ContentDecodingError,
)
# The peer went away: worth another attempt, unlike an answer that makes no sense.
_DISCONNECT_ERRORS = (http.client.RemoteDisconnected, http.client.IncompleteRead)
# How a kept connection the server has closed fails the next request sent on it.
KEPT_CONNECTION_DROPS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


def _node_class(exc: BaseException) -> str | None:
    if isinstance(exc, AddressRefusedError):
        return "refused_address"
    if isinstance(exc, _INVALID_RESPONSE_ERRORS):
        return "invalid_response"
    if isinstance(exc, _DISCONNECT_ERRORS):
        return "connection_error"
    if isinstance(exc, http.client.HTTPException):
        return "invalid_response"
    if isinstance(exc, _INVALID_URL_ERRORS):
        return "invalid_url"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        # urllib3 makes this a subclass of its connect-timeout error; it is not one.
        return "connection_error"
    if isinstance(
        exc, TimeoutError | urllib3.exceptions.TimeoutError | requests.exceptions.Timeout
    ):
        return "timeout"
    if isinstance(
        exc,
        OSError
        | requests.exceptions.ConnectionError
        | requests.exceptions.ChunkedEncodingError
        | urllib3.exceptions.ProtocolError
        | urllib3.exceptions.SSLError,
    ):
        return "connection_error"
    return None


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and everything it wraps, outermost first."""
    seen: list[BaseException] = []
    pending = [exc]
    while pending:
        current = pending.pop(0)
        if any(current is known for known in seen):
            continue
        seen.append(current)
        wrapped = [current.__cause__, getattr(current, "reason", None), *current.args]
        if not current.__suppress_context__:
            wrapped.append(current.__context__)
        pending.extend(item for item in wrapped if isinstance(item, BaseException))
    return seen


def classify(exc: BaseException, deadline: Deadline, timeout: float) -> FetchError | None:
    """The FetchError for what requests raised, judged by the innermost cause that says
    something; `None` for an exception that is not about the fetch (a bug: re-raised)."""
    if deadline.stopped:
        return FetchError("cancelled", "the job was cancelled while fetching")
    if deadline.expired:
        return FetchError("timeout", f"no complete answer within {timeout:g} s (deadline)")
    for cause in reversed(causes(exc)):
        error_class = _node_class(cause)
        if error_class is not None:
            detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
            if error_class == "refused_address":
                detail = str(cause)
            return FetchError(error_class, detail[:_MAX_DETAIL_CHARS])
    return None
