"""A safe, bounded HTTP GET of a client's URL, with `requests` (SPEC SCR-2, SCR-13).

Safety against SSRF is decided where the socket is opened: urllib3 connections of our own
resolve the host with `getaddrinfo`, check every candidate address, and connect only to an
allowed one. The address checked is the address connected to, so a DNS answer that changes
between a check and the connect (rebinding) cannot slip through, and redirects — followed
here, one hop at a time — go through the same check. Loopback, private, link-local, CGNAT,
multicast, reserved and every other non-global address is refused unless inside the
configured allow-list (`PIN_SCRAPING_ALLOWED_CIDRS`); a refused address gets no packet.

Bounds: the body is streamed into a spooled temporary file and cut at `max_body_bytes`;
one deadline covers the whole fetch (redirects, headers, body): a watchdog thread shuts the
socket of a fetch that outlives it, so a target trickling bytes cannot hold a slot. It
shuts as well the socket of a fetch whose `should_stop` turned true (a cancel, a stopping
worker, a lease in doubt), looked at every 0.25 s: a target that accepts and never answers
holds no stopping worker until the deadline.

A `Fetcher` is shared by the worker's threads: one `requests.Session` whose connection
pools never block (a host gets as many connections as there are concurrent fetches to it).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import heapq
import http.client
import http.cookiejar
import ipaddress
import itertools
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO, Protocol
from urllib.parse import urlsplit

import requests
import requests.adapters
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.poolmanager
from urllib3.util.connection import allowed_gai_family

from pin_orchestration.scraping.fetch.headers import (
    content_length_error,
    parse_content_length,
    resolve_location,
)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

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

ALLOWED_CIDRS_VARIABLE = "PIN_SCRAPING_ALLOWED_CIDRS"

# Ranges that `is_global` already excludes, named so the refusal never depends on how a
# Python release draws that line.
_ALWAYS_REFUSED_V4 = (
    ipaddress.IPv4Network("0.0.0.0/8"),
    ipaddress.IPv4Network("100.64.0.0/10"),
)
# NAT64's well-known prefix embeds an IPv4 address a NAT64 gateway would connect to.
_NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")

_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_SPOOL_IN_MEMORY_BYTES = 1024 * 1024
_READ_CHUNK_BYTES = 64 * 1024
# Host pools kept (LRU); a pool keeps at most as many idle connections as the fetches that
# ran against its host at once, capped here. Never blocking: a fetch beyond the cap opens
# its own connection instead of waiting for one.
_HOST_POOLS_KEPT = 64
_CONNECTIONS_KEPT_PER_HOST = 1024
_MAX_DETAIL_CHARS = 300


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


def parse_allowed_cidrs(value: str) -> tuple[IPNetwork, ...]:
    """`"127.0.0.1/32, 10.0.0.0/8"` → networks; empty items are ignored, an address alone
    is its own /32 or /128."""
    networks: list[IPNetwork] = []
    for item in value.split(","):
        text = item.strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as exc:
            raise ValueError(
                f"{ALLOWED_CIDRS_VARIABLE}: {text!r} is not a network ({exc}); give a comma "
                "list of CIDRs with no host bits set, e.g. 127.0.0.1/32,10.0.0.0/8"
            ) from None
    return tuple(networks)


def is_address_allowed(address: IPAddress, allowed_cidrs: tuple[IPNetwork, ...]) -> bool:
    """Whether a fetch may connect to `address`: a global unicast address, or one inside
    `allowed_cidrs`. IPv6 forms that carry an IPv4 address (mapped, 6to4, NAT64) are judged
    by the IPv4 address they lead to."""
    effective = _effective_address(address)
    if any(effective in network or address in network for network in allowed_cidrs):
        return True
    if isinstance(effective, ipaddress.IPv4Address) and any(
        effective in network for network in _ALWAYS_REFUSED_V4
    ):
        return False
    if isinstance(effective, ipaddress.IPv6Address) and effective.is_site_local:
        return False
    return effective.is_global and not (
        effective.is_multicast
        or effective.is_private
        or effective.is_loopback
        or effective.is_link_local
        or effective.is_reserved
        or effective.is_unspecified
    )


def _effective_address(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in _NAT64_PREFIX:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


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


class FetchError(Exception):
    """No usable answer. `error_class` is one of `FETCH_ERROR_CLASSES`, stable for the
    retry planner and the attempts list; `detail` is short human text."""

    def __init__(self, error_class: str, detail: str) -> None:
        if error_class not in FETCH_ERROR_CLASSES:
            raise ValueError(f"unknown fetch error class {error_class!r}")
        super().__init__(f"{error_class}: {detail}")
        self.error_class = error_class
        self.detail = detail


class AddressRefusedError(Exception):
    """Raised inside urllib3's connect when no resolved address may be connected to.

    Deliberately not an OSError: urllib3 and requests wrap those into connection errors
    (and may retry them); this must reach the fetcher as it is.
    """

    def __init__(self, host: str, addresses: list[str]) -> None:
        shown = ", ".join(dict.fromkeys(addresses)) or "no address"
        where = host if shown == host else f"{host} ({shown})"
        super().__init__(
            f"{where}: not a public address and not in {ALLOWED_CIDRS_VARIABLE}; "
            "nothing was sent to it"
        )


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
        self._watchdog = _Watchdog()
        self._session = _guarded_session(policy)

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
        target = _checked_url(url, what="url")
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
        target = _checked_url(url, what="url")
        timeout = self.policy.timeout_seconds

        def send(deadline: _Deadline, started: float) -> FetchResult:
            response = _sent_again_if_kept_connection_dropped(
                functools.partial(
                    self._session.post,
                    target,
                    data=body,
                    headers=dict(headers or {}),
                    timeout=(timeout, timeout),
                    allow_redirects=False,
                    stream=True,
                ),
                deadline,
            )
            return _read_answer(response, self.policy, None, deadline, started, cut=True)

        return self._guarded(send)

    def _guarded(
        self,
        call: Callable[[_Deadline, float], FetchResult],
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
        outer = getattr(_current, "deadline", None)
        _current.deadline = deadline
        try:
            return call(deadline, started)
        except FetchError:
            raise
        except Exception as exc:
            error = _classify(exc, deadline, timeout)
            if error is None:
                raise
            raise error from exc
        finally:
            _current.deadline = outer
            deadline.finish()

    def _fetch(
        self,
        url: str,
        query: list[tuple[str, str]],
        should_stop: Callable[[], bool] | None,
        redirect_slots: RedirectSlots | None,
        deadline: _Deadline,
        started: float,
        check_hop: Callable[[str], None] | None = None,
        timeout: float | None = None,
    ) -> FetchResult:
        timeout = timeout or self.policy.timeout_seconds
        for hop in range(self.policy.max_redirects + 1):
            _raise_if_stopped(should_stop)
            response = _sent_again_if_kept_connection_dropped(
                functools.partial(
                    self._session.get,
                    url,
                    params=query if hop == 0 else None,
                    timeout=(timeout, timeout),
                    allow_redirects=False,
                    stream=True,
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
            url = _checked_url(location, what="redirect location")
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
    deadline: _Deadline,
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
    send: Callable[[], requests.Response], deadline: _Deadline
) -> requests.Response:
    """`send()`, sent again when it went out on a kept (reused) connection that the server
    closed without a byte of answer. A server may shut an idle kept connection at any
    moment (RFC 9112 §9.3.1), so the request crossing its close is the connection's
    failure, not the target's: clients send it again on another connection (§9.3.1.1).
    A new connection that fails the same way fails the fetch, and so does one past the
    deadline (the watchdog shut it)."""
    for _ in range(_KEPT_CONNECTION_RESENDS):
        _current.kept_connection = False
        try:
            return send()
        except requests.exceptions.ConnectionError as exc:
            if deadline.expired or not _current.kept_connection:
                raise
            if not any(isinstance(cause, _KEPT_CONNECTION_DROPS) for cause in _causes(exc)):
                raise
    _current.kept_connection = False
    return send()


def _raise_if_stopped(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise FetchError("cancelled", "the job was cancelled while fetching")


def _checked_url(url: str, *, what: str) -> str:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise FetchError("invalid_url", f"{what} {url[:200]!r} does not parse: {exc}") from None
    if parts.scheme.lower() not in ("http", "https"):
        raise FetchError(
            "invalid_url", f"{what} {url[:200]!r}: scheme must be http or https"
        ) from None
    if not parts.hostname:
        raise FetchError("invalid_url", f"{what} {url[:200]!r} has no host") from None
    return url


def request_url(url: str, params: Mapping[str, Any] | None) -> str:
    """The URL `Fetcher.fetch(url, params)` asks for first (robots.txt judges this one)."""
    try:
        return requests.Request("GET", url, params=_query_pairs(params)).prepare().url or url
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


# --- classification of what requests/urllib3 raised ---------------------------------------

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
_KEPT_CONNECTION_DROPS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


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


def _causes(exc: BaseException) -> list[BaseException]:
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


def _classify(exc: BaseException, deadline: _Deadline, timeout: float) -> FetchError | None:
    """The FetchError for what requests raised, judged by the innermost cause that says
    something; `None` for an exception that is not about the fetch (a bug: re-raised)."""
    if deadline.stopped:
        return FetchError("cancelled", "the job was cancelled while fetching")
    if deadline.expired:
        return FetchError("timeout", f"no complete answer within {timeout:g} s (deadline)")
    for cause in reversed(_causes(exc)):
        error_class = _node_class(cause)
        if error_class is not None:
            detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
            if error_class == "refused_address":
                detail = str(cause)
            return FetchError(error_class, detail[:_MAX_DETAIL_CHARS])
    return None


# --- the connect-time address check inside urllib3 ---------------------------------------


class _AddressGuard:
    def __init__(self, allowed_cidrs: tuple[IPNetwork, ...]) -> None:
        self.allowed_cidrs = allowed_cidrs

    def allows(self, address: str) -> bool:
        try:
            parsed = ipaddress.ip_address(address)
        except ValueError:
            return False
        return is_address_allowed(parsed, self.allowed_cidrs)


class _GuardedConnectionMixin:
    """Replaces urllib3's `HTTPConnection._new_conn` (urllib3 2.x): resolve, check every
    address, connect only to allowed ones. TLS (SNI, certificate host) and the Host header
    still use the hostname: only the socket's destination is chosen here."""

    # Set by urllib3.connection.HTTPConnection.
    _dns_host: str
    host: str
    port: int
    timeout: Any
    source_address: tuple[str, int] | None
    socket_options: Any

    def __init__(self, *args: Any, address_guard: _AddressGuard, **kwargs: Any) -> None:
        self._address_guard = address_guard
        super().__init__(*args, **kwargs)

    def _new_conn(self) -> socket.socket:
        host = self._dns_host.strip("[]")
        try:
            candidates = socket.getaddrinfo(
                host, self.port, allowed_gai_family(), socket.SOCK_STREAM
            )
        except socket.gaierror as exc:
            raise urllib3.exceptions.NameResolutionError(self.host, self, exc) from exc  # type: ignore[arg-type]
        except UnicodeError:
            # The resolver's IDNA encoding refuses the name (a label over 63 characters).
            raise urllib3.exceptions.LocationParseError(
                f"{host!r}: not a valid host name"
            ) from None
        allowed = [c for c in candidates if self._address_guard.allows(str(c[4][0]))]
        if not allowed:
            raise AddressRefusedError(self.host, [str(c[4][0]) for c in candidates])
        deadline: _Deadline | None = getattr(_current, "deadline", None)
        error: OSError | None = None
        for family, socktype, proto, _, sockaddr in allowed:
            sock = socket.socket(family, socktype, proto)
            try:
                for option in self.socket_options or ():
                    sock.setsockopt(*option)
                sock.settimeout(_connect_timeout(self.timeout, deadline))
                if self.source_address:
                    sock.bind(self.source_address)
                sock.connect(sockaddr)
            except TimeoutError as exc:
                sock.close()
                raise urllib3.exceptions.ConnectTimeoutError(
                    self, f"Connection to {self.host} timed out (connect timeout={self.timeout})"
                ) from exc
            except OSError as exc:
                sock.close()
                error = exc
                continue
            sock.settimeout(self.timeout if isinstance(self.timeout, int | float) else None)
            sys.audit("http.client.connect", self, self.host, self.port)
            return sock
        assert error is not None
        raise urllib3.exceptions.NewConnectionError(
            self,  # type: ignore[arg-type]
            f"Failed to establish a new connection: {error}",
        ) from error

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        deadline: _Deadline | None = getattr(_current, "deadline", None)
        if deadline is not None:
            # The socket to shut at the deadline, as it is after any TLS wrapping.
            deadline.watch(self)


def _connect_timeout(timeout: Any, deadline: _Deadline | None) -> float | None:
    limit = float(timeout) if isinstance(timeout, int | float) else None
    if deadline is not None:
        remaining = max(deadline.remaining(), 0.001)
        limit = remaining if limit is None else min(limit, remaining)
    return limit


class _GuardedHTTPConnection(_GuardedConnectionMixin, urllib3.connection.HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnectionMixin, urllib3.connection.HTTPSConnection):
    pass


class _DeadlineWatchedPoolMixin:
    """Hands each connection taken for a fetch to that fetch's deadline, and takes it back
    when the connection returns to the pool (so an expiring deadline never touches a
    connection another fetch is using by then)."""

    def _get_conn(self, timeout: float | None = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        # A kept connection has its socket already (see _sent_again_if_kept_connection_dropped).
        _current.kept_connection = getattr(conn, "sock", None) is not None
        deadline: _Deadline | None = getattr(_current, "deadline", None)
        if deadline is not None:
            deadline.watch(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            watching: _Deadline | None = getattr(conn, "_pin_deadline", None)
            if watching is not None:
                watching.unwatch(conn)
        super()._put_conn(conn)  # type: ignore[misc]


class _GuardedHTTPConnectionPool(
    _DeadlineWatchedPoolMixin, urllib3.connectionpool.HTTPConnectionPool
):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSConnectionPool(
    _DeadlineWatchedPoolMixin, urllib3.connectionpool.HTTPSConnectionPool
):
    ConnectionCls = _GuardedHTTPSConnection


class _GuardedPoolManager(urllib3.poolmanager.PoolManager):
    def __init__(self, address_guard: _AddressGuard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._address_guard = address_guard
        self.pool_classes_by_scheme = {
            "http": _GuardedHTTPConnectionPool,
            "https": _GuardedHTTPSConnectionPool,
        }

    def _new_pool(
        self,
        scheme: str,
        host: str,
        port: int,
        request_context: dict[str, Any] | None = None,
    ) -> urllib3.connectionpool.HTTPConnectionPool:
        # Not in connection_pool_kw: that would make it part of urllib3's pool key.
        context = dict(self.connection_pool_kw if request_context is None else request_context)
        context["address_guard"] = self._address_guard
        return super()._new_pool(scheme, host, port, context)


class _GuardedAdapter(requests.adapters.HTTPAdapter):
    def __init__(self, address_guard: _AddressGuard) -> None:
        self._address_guard = address_guard
        super().__init__(
            pool_connections=_HOST_POOLS_KEPT,
            pool_maxsize=_CONNECTIONS_KEPT_PER_HOST,
            max_retries=0,
            pool_block=False,
        )

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        self._pool_connections = connections
        self._pool_maxsize = maxsize
        self._pool_block = block
        self.poolmanager = _GuardedPoolManager(
            self._address_guard, num_pools=connections, maxsize=maxsize, block=block, **pool_kwargs
        )

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        # A proxy would be the only address checked; the target's would never be.
        raise requests.exceptions.InvalidURL("fetches never go through a proxy")


class _NoCookies(http.cookiejar.DefaultCookiePolicy):
    """The session is shared by every job of every tenant: a cookie one target sets must
    never be sent with another job's request."""

    def set_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: http.cookiejar.Cookie, request: Any) -> bool:
        return False


class _OwnRedirectsSession(requests.Session):
    """Redirects are followed by `Fetcher._fetch`, one checked hop at a time. requests
    still reads the Location of every answer (to offer the next request), and raises on
    one that is not UTF-8 or does not parse; here it never reads it."""

    def get_redirect_target(self, resp: requests.Response) -> None:
        return None


def _guarded_session(policy: FetchPolicy) -> requests.Session:
    session = _OwnRedirectsSession()
    # No proxies, .netrc credentials or CA bundle overrides from the environment.
    session.trust_env = False
    session.cookies.set_policy(_NoCookies())
    session.headers["User-Agent"] = policy.user_agent
    adapter = _GuardedAdapter(_AddressGuard(policy.allowed_cidrs))
    for prefix in list(session.adapters):
        session.adapters.pop(prefix).close()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


# --- the deadline watchdog ----------------------------------------------------------------

_current = threading.local()


class _Deadline:
    """The end of one fetch, and the connections (with their sockets) it is using.

    Sockets are kept beside their connection because http.client lets go of a connection's
    socket (`conn.sock = None`) as soon as an answer says the connection will close, while
    the body is still read from it.
    """

    def __init__(self, at: float, should_stop: Callable[[], bool] | None = None) -> None:
        self.at = at
        self.should_stop = should_stop
        # Shut because should_stop turned true (the fetch is `cancelled`, not timed out).
        self.stopped = False
        self.expired = False
        self._finished = False
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[Any, list[socket.socket]]] = {}

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def watch(self, conn: Any) -> None:
        """Called when a fetch takes `conn` from its pool and again when `conn` connects."""
        with self._lock:
            if self._finished:
                return
            conn._pin_deadline = self
            _, sockets = self._watched.setdefault(id(conn), (conn, []))
            sock = conn.sock
            if sock is not None and all(sock is not known for known in sockets):
                sockets.append(sock)
            if self.expired:
                _shut(conn, sockets)

    def unwatch(self, conn: Any) -> None:
        with self._lock:
            if getattr(conn, "_pin_deadline", None) is self:
                conn._pin_deadline = None
            self._watched.pop(id(conn), None)

    def expire(self) -> bool:
        """Shut every socket of the fetch; `False` once the fetch is over."""
        with self._lock:
            if self._finished:
                return False
            self.expired = True
            for conn, sockets in self._watched.values():
                _shut(conn, sockets)
            return True

    def look(self, now: float, reshut_seconds: float, poll_seconds: float) -> float | None:
        """The watchdog's look at this fetch: shut it when its deadline has passed or
        `should_stop` turned true (again while it is not over: a socket may still have been
        connecting). When to look again, or `None` once the fetch is over."""
        if self._finished:
            return None
        if not self.expired and now < self.at:
            if not self._stop_asked():
                return min(self.at, now + poll_seconds)
            self.stopped = True
        return now + reshut_seconds if self.expire() else None

    def _stop_asked(self) -> bool:
        if self.should_stop is None:
            return False
        try:
            return self.should_stop()
        except Exception:
            # The fetch's own thread calls it too, and gets the error there; the watchdog
            # must outlive it for every other fetch.
            return False

    def finish(self) -> None:
        with self._lock:
            self._finished = True
            for conn, _ in self._watched.values():
                if getattr(conn, "_pin_deadline", None) is self:
                    conn._pin_deadline = None
            self._watched.clear()


def _shut(conn: Any, sockets: list[socket.socket]) -> None:
    current = conn.sock
    for sock in [*sockets, *([current] if current is not None else [])]:
        # The plain socket's shutdown even for TLS: it wakes the thread blocked in recv
        # without tearing the SSL object out from under it. A socket already closed has
        # given up its descriptor (fileno -1), so this never reaches another connection.
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One thread per Fetcher that expires deadlines, so a fetch blocked in a receive (a
    target trickling headers or body) is woken at its deadline instead of holding a slot.
    An expired fetch is shut again every `_RESHUT_SECONDS` until it finishes, which covers a
    socket that was still connecting at the first expiry."""

    _RESHUT_SECONDS = 0.5
    # How often a fetch's should_stop is looked at while it waits (a stop, a cancel, a
    # lease in doubt): a target that accepts and never answers no longer holds the slot
    # to the deadline.
    _STOP_POLL_SECONDS = 0.25

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, _Deadline]] = []
        self._order = itertools.count()
        self._wakeup = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self, at: float, should_stop: Callable[[], bool] | None = None) -> _Deadline:
        deadline = _Deadline(at, should_stop)
        first = at if should_stop is None else min(at, time.monotonic() + self._STOP_POLL_SECONDS)
        with self._wakeup:
            if self._stopped:
                raise RuntimeError("the fetcher is closed")
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pin-fetch-watchdog", daemon=True
                )
                self._thread.start()
            heapq.heappush(self._heap, (first, next(self._order), deadline))
            if self._heap[0][2] is deadline:
                self._wakeup.notify()
        return deadline

    def stop(self) -> None:
        with self._wakeup:
            self._stopped = True
            self._wakeup.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while True:
                    if self._stopped:
                        return
                    now = time.monotonic()
                    if self._heap and self._heap[0][0] <= now:
                        _, _, deadline = heapq.heappop(self._heap)
                        break
                    self._wakeup.wait(self._heap[0][0] - now if self._heap else None)
            # Outside the lock: should_stop is the caller's code.
            again = deadline.look(now, self._RESHUT_SECONDS, self._STOP_POLL_SECONDS)
            if again is not None:
                with self._wakeup:
                    heapq.heappush(self._heap, (again, next(self._order), deadline))
