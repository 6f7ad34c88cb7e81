"""A safe, bounded HTTP GET of a client's URL, with `requests` (SPEC SCR-2, SCR-13).

Safety against SSRF is decided where the socket is opened (guard.py): the address checked
is the address connected to, and redirects — followed here, one hop at a time — go through
the same check.

Bounds: the body is streamed into a spooled temporary file and cut at `max_body_bytes`;
one deadline covers the whole fetch (redirects, headers, body): a watchdog thread
(deadline.py) shuts the socket of a fetch that outlives it, so a target trickling bytes
cannot hold a slot. It shuts as well the socket of a fetch whose `should_stop` turned true
(a cancel, a stopping worker, a lease in doubt), looked at every 0.25 s: a target that
accepts and never answers holds no stopping worker until the deadline. What requests raises
becomes a `FetchError` of a stable class (errors.py).

A `Fetcher` is shared by the worker's threads: one `requests.Session` whose connection
pools never block (a host gets as many connections as there are concurrent fetches to it).
"""

from __future__ import annotations

import functools
import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit

import requests
from requests.structures import CaseInsensitiveDict

from pin_orchestration.scraping.fetch.deadline import Deadline, Watchdog, current_fetch
from pin_orchestration.scraping.fetch.errors import (
    KEPT_CONNECTION_DROPS,
    FetchError,
    causes,
    classify,
)
from pin_orchestration.scraping.fetch.guard import IPNetwork, guarded_session
from pin_orchestration.scraping.fetch.headers import (
    content_length_error,
    parse_content_length,
    resolve_location,
)
from pin_orchestration.scraping.fetch.urls import checked_hop, checked_url

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_SPOOL_IN_MEMORY_BYTES = 1024 * 1024
_READ_CHUNK_BYTES = 64 * 1024


# Names the service and where to reach its operators; its product token (the first word)
# is what robots.txt groups are matched against (scraping/fetch/robots.py).
DEFAULT_USER_AGENT = "pin-scraper/0.1 (+https://github.com/pin-orchestration)"


def product_token(user_agent: str) -> str:
    """A User-Agent's product token, RFC 9309's name of the crawler: its leading letters,
    '_' and '-' (`pin-scraper/0.1 (...)` → `pin-scraper`). ValueError when it has none."""
    token = ""
    for char in user_agent:
        if not (char.isascii() and (char.isalpha() or char in "_-")):
            break
        token += char
    if not token:
        raise ValueError("does not start with a product token (letters, '_', '-')")
    return token


@dataclass(frozen=True)
class FetchPolicy:
    # Connect and read timeout, and the deadline for the whole fetch (redirects and body).
    timeout_seconds: float = 30.0
    max_body_bytes: int = 50 * 1024 * 1024
    allowed_cidrs: tuple[IPNetwork, ...] = ()
    max_redirects: int = 5
    user_agent: str = DEFAULT_USER_AGENT
    # Keep the first max_body_bytes of a longer body instead of failing (robots.txt: RFC
    # 9309 has a crawler parse a prefix of a large file).
    truncate_body: bool = False

    def __post_init__(self) -> None:
        if not self.timeout_seconds > 0:
            raise ValueError(f"timeout_seconds must be positive, got {self.timeout_seconds}")
        if self.max_body_bytes < 0:
            raise ValueError(f"max_body_bytes must not be negative, got {self.max_body_bytes}")
        if self.max_redirects < 0:
            raise ValueError(f"max_redirects must not be negative, got {self.max_redirects}")


@dataclass
class FetchResult:
    """The target answered (any status); the body is read and rewound."""

    status_code: int
    headers: Mapping[str, str]  # case-insensitive
    content_type: str | None
    body: BinaryIO  # a SpooledTemporaryFile, at position 0
    size: int
    sha256: str
    final_url: str
    elapsed_ms: int

    def close(self) -> None:
        self.body.close()

    def __enter__(self) -> FetchResult:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RedirectSlots(Protocol):
    """A job's politeness for its redirect hops, each a request to its host (the worker's,
    in PostgreSQL): `take(host)` returns 0 when a request to `host` may be sent now
    (counted against that host's limits), else the seconds to wait before asking again;
    `release()` gives back what the last hop took, once the fetch has ended."""

    def take(self, host: str) -> float: ...

    def release(self) -> None: ...


class Fetcher:
    """Fetches with one policy; thread-safe, meant to be shared by all of a worker's threads."""

    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy
        self._watchdog = Watchdog()
        self._session = guarded_session(policy.allowed_cidrs, policy.user_agent)
        self._adapter = self._session.get_adapter("http://")

    def close(self) -> None:
        self._session.close()
        self._watchdog.stop()

    def __enter__(self) -> Fetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def fetch(
        self,
        url: str,
        params: Mapping[str, Any] | None = None,
        *,
        should_stop: Callable[[], bool] | None = None,
        redirect_slots: RedirectSlots | None = None,
        check_hop: Callable[[str], None] | None = None,
        timeout_seconds: float | None = None,
    ) -> FetchResult:
        """GET `url` with `params` added to its query, following redirects up to the
        policy's limit; each hop is first shown to `check_hop` (robots.txt: it raises to
        refuse the hop, and its exception ends the fetch as it is), then waits for
        `redirect_slots` to give it a place on its host (within the fetch's deadline: past
        it the fetch fails with `timeout`). Returns the final answer whatever its status;
        raises `FetchError` when there is none (or `should_stop` turned true: `cancelled`).
        `timeout_seconds` replaces the policy's for this fetch (a job's own timeout)."""
        query = _query_pairs(params)
        target = checked_url(url, what="url")
        timeout = timeout_seconds or self.policy.timeout_seconds
        try:
            return self._guarded(
                lambda deadline, started: self._fetch(
                    target,
                    query,
                    should_stop,
                    redirect_slots,
                    deadline,
                    started,
                    check_hop,
                    timeout,
                ),
                timeout,
                should_stop,
            )
        finally:
            if redirect_slots is not None:
                redirect_slots.release()

    def post(self, url: str, body: bytes, headers: Mapping[str, str] | None = None) -> FetchResult:
        """POST `body` to `url` under the same address check, timeout and deadline as
        `fetch`. Redirects are not followed (the answer is returned as it is): a callback
        that moved is the receiver's to fix, and a redirect must not turn a POST into a
        request to somewhere else. The answer's status is what counts: its body is read
        up to the policy's limit and cut there (the connection then closed, not reused),
        never a `body_too_large` failure of an answer that was given."""
        target = checked_url(url, what="url")
        timeout = self.policy.timeout_seconds

        def send(deadline: Deadline, started: float) -> FetchResult:
            response = _sent_again_if_kept_connection_dropped(
                functools.partial(
                    self._send, "POST", target, data=body, headers=headers, timeout=timeout
                ),
                deadline,
            )
            return _read_answer(response, self.policy, None, deadline, started, cut=True)

        return self._guarded(send)

    def _send(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        params: list[tuple[str, str]] | None = None,
        data: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """One request, redirects not followed, the body left to stream: what
        `session.request(..., allow_redirects=False, stream=True)` sends, without what the
        session would merge into it per request (its empty cookie jar copied, no proxies
        or environment: trust_env is off and the adapter refuses proxies, no hooks, no
        auth but the URL's): a fifth of a fetch's CPU, at hundreds of fetches a second."""
        session = self._session
        sent_headers = session.headers
        if headers:
            sent_headers = CaseInsensitiveDict(session.headers)
            sent_headers.update(headers)
        prepared = requests.PreparedRequest()
        prepared.prepare(
            method=method,
            url=url,
            headers=sent_headers,
            data=data,
            # None, not an empty list: requests then skips its encoding, whose check for a
            # file-like object (a runtime Protocol) costs more than the rest of the URL.
            params=params or None,
            cookies=session.cookies,
        )
        return self._adapter.send(
            prepared,
            stream=True,
            timeout=(timeout, timeout),
            verify=session.verify,
            cert=session.cert,
            proxies={},
        )

    def _guarded(
        self,
        call: Callable[[Deadline, float], FetchResult],
        timeout: float | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> FetchResult:
        """Run one request under the deadline (`timeout`, else the policy's), and under
        `should_stop`, which the watchdog looks at while the request waits (a target that
        never answers holds no stopping worker); what requests raises becomes a
        `FetchError`."""
        timeout = timeout or self.policy.timeout_seconds
        started = time.monotonic()
        deadline = self._watchdog.start(started + timeout, should_stop)
        # A fetch inside a fetch (a redirect hop's robots.txt) gives the outer one its
        # deadline back when it ends.
        outer = getattr(current_fetch, "deadline", None)
        current_fetch.deadline = deadline
        try:
            return call(deadline, started)
        except FetchError:
            raise
        except Exception as exc:
            error = classify(exc, deadline, timeout)
            if error is None:
                raise
            raise error from exc
        finally:
            current_fetch.deadline = outer
            deadline.finish()

    def _fetch(
        self,
        url: str,
        query: list[tuple[str, str]],
        should_stop: Callable[[], bool] | None,
        redirect_slots: RedirectSlots | None,
        deadline: Deadline,
        started: float,
        check_hop: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> FetchResult:
        timeout = timeout or self.policy.timeout_seconds
        for hop in range(self.policy.max_redirects + 1):
            _raise_if_stopped(should_stop)
            response = _sent_again_if_kept_connection_dropped(
                functools.partial(
                    self._send, "GET", url, params=query if hop == 0 else [], timeout=timeout
                ),
                deadline,
            )
            if not (response.status_code in _REDIRECT_STATUSES and "location" in response.headers):
                return _read_answer(response, self.policy, should_stop, deadline, started)
            response.close()
            location = resolve_location(response.headers["location"], response.url)
            if location is None:
                raise FetchError(
                    "invalid_response",
                    f"HTTP {response.status_code} with a Location that is no URL: "
                    f"{response.headers['location'][:200]!r}",
                )
            if hop == self.policy.max_redirects:
                raise FetchError(
                    "too_many_redirects",
                    f"more than {self.policy.max_redirects} redirects (last to {location[:200]})",
                )
            url = checked_hop(location)
            if check_hop is not None:
                check_hop(url)
            if redirect_slots is not None:
                self._wait_for_slot(redirect_slots, url, should_stop, started, timeout)
        raise AssertionError("unreachable: the loop returns or raises")

    def _wait_for_slot(
        self,
        redirect_slots: RedirectSlots,
        url: str,
        should_stop: Callable[[], bool] | None,
        started: float,
        timeout: float,
    ) -> None:
        host = urlsplit(url).hostname or ""
        ends = started + timeout
        while (wait := redirect_slots.take(host)) > 0:
            if time.monotonic() + wait > ends:
                raise FetchError(
                    "timeout",
                    f"redirect to {host[:200]}: no request slot of that host within the "
                    f"{timeout:g} s deadline (it is paused or at its limits)",
                )
            # Short naps: a slot freed by another worker is not announced.
            time.sleep(min(wait, 0.05))
            _raise_if_stopped(should_stop)


def _read_answer(
    response: requests.Response,
    policy: FetchPolicy,
    should_stop: Callable[[], bool] | None,
    deadline: Deadline,
    started: float,
    *,
    cut: bool = False,
) -> FetchResult:
    """The answer, its body read whole; past `policy.max_body_bytes` a `body_too_large`
    error, or with `cut` (or a policy that truncates, robots.txt's) the bytes up to the
    limit (the rest unread)."""
    cut = cut or policy.truncate_body
    with response:
        framing = content_length_error(
            response.status_code,
            response.headers.get("content-length"),
            response.headers.get("transfer-encoding"),
        )
        if framing is not None:
            # The answer ends here, unread, and its connection with it: what follows on
            # that connection has no known start.
            raise FetchError("invalid_response", f"HTTP {response.status_code}: {framing}")
        declared = parse_content_length(response.headers.get("content-length"))
        if declared is not None and declared > policy.max_body_bytes and not cut:
            raise FetchError(
                "body_too_large",
                f"Content-Length {declared} exceeds the limit of {policy.max_body_bytes} bytes",
            )
        body = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115
        try:
            digest = hashlib.sha256()
            size = 0
            while True:
                _raise_if_stopped(should_stop)
                # read1 returns what one receive brought, so cancellation is checked while a
                # slow target trickles; decoding is bounded by the chunk size.
                chunk = response.raw.read1(_READ_CHUNK_BYTES, decode_content=True)
                if not chunk:
                    break
                over = size + len(chunk) > policy.max_body_bytes
                if over and not cut:
                    raise FetchError(
                        "body_too_large",
                        f"body exceeds the limit of {policy.max_body_bytes} bytes",
                    )
                if over:
                    # Cut: the rest is left unread (closing the response drops the connection).
                    chunk = chunk[: policy.max_body_bytes - size]
                size += len(chunk)
                digest.update(chunk)
                body.write(chunk)
                if over:
                    break
            if deadline.stopped:
                raise FetchError("cancelled", "the job was cancelled while fetching")
            if deadline.expired:
                # The watchdog's shutdown reads as the end of a body that has no length.
                raise FetchError(
                    "timeout",
                    f"body not complete within {policy.timeout_seconds:g} s (deadline)",
                )
            body.seek(0)
        except BaseException:
            body.close()
            raise
    return FetchResult(
        status_code=response.status_code,
        headers=response.headers,
        content_type=response.headers.get("content-type"),
        body=body,  # type: ignore[arg-type]  # SpooledTemporaryFile is a binary file
        size=size,
        sha256=digest.hexdigest(),
        final_url=response.url,
        elapsed_ms=int((time.monotonic() - started) * 1000),
    )


# A kept connection found dropped is sent on again at most this many times in one request
# (each time on the next kept connection, or a new one: a server that shut its idle
# connections at once may have shut several).
_KEPT_CONNECTION_RESENDS = 3


def _sent_again_if_kept_connection_dropped(
    send: Callable[[], requests.Response], deadline: Deadline
) -> requests.Response:
    """`send()`, sent again when it went out on a kept (reused) connection that the server
    closed without a byte of answer. A server may shut an idle kept connection at any
    moment (RFC 9112 §9.3.1), so the request crossing its close is the connection's
    failure, not the target's: clients send it again on another connection (§9.3.1.1).
    A new connection that fails the same way fails the fetch, and so does one past the
    deadline (the watchdog shut it)."""
    for _ in range(_KEPT_CONNECTION_RESENDS):
        current_fetch.kept_connection = False
        try:
            return send()
        except requests.exceptions.ConnectionError as exc:
            if deadline.expired or not current_fetch.kept_connection:
                raise
            if not any(isinstance(cause, KEPT_CONNECTION_DROPS) for cause in causes(exc)):
                raise
    current_fetch.kept_connection = False
    return send()


def _raise_if_stopped(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise FetchError("cancelled", "the job was cancelled while fetching")


def request_url(url: str, params: Mapping[str, Any] | None) -> str:
    """The URL `Fetcher.fetch(url, params)` asks for first (robots.txt judges this one)."""
    try:
        # Only the URL of what `requests.Request("GET", url, params=…).prepare()` builds
        # (the same prepare_url; headers, cookies, body and hooks would be thrown away),
        # once per job, so a slot's robots.txt check costs no full request preparation.
        prepared = requests.PreparedRequest()
        prepared.prepare_url(url, _query_pairs(params) or None)
        return prepared.url or url
    except Exception:
        # The fetch refuses it with its own error.
        return url


def _query_pairs(params: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The job's JSON `params` as query pairs: a list repeats its key; booleans are
    `true`/`false` and null is an empty value, as JSON spells them."""
    pairs: list[tuple[str, str]] = []
    for key, value in (params or {}).items():
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, dict | list):
                raise FetchError(
                    "invalid_url",
                    f"params.{key}: a query value must be a string, number, boolean or a "
                    "list of those",
                )
            if isinstance(item, str):
                pairs.append((str(key), item))
            elif item is None:
                pairs.append((str(key), ""))
            else:
                pairs.append((str(key), json.dumps(item)))
    return pairs
