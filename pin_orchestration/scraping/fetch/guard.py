"""The SSRF guard, decided where the socket is opened: urllib3 connections of our own resolve
the host with `getaddrinfo`, check every candidate address, and connect only to an allowed
one, so a DNS answer that changes between a check and the connect (rebinding) cannot slip
through. Loopback, private, link-local, CGNAT, multicast, reserved and every other
non-global address is refused unless inside the configured allow-list
(`PIN_SCRAPING_ALLOWED_CIDRS`); a refused address gets no packet.
"""

from __future__ import annotations

import http.cookiejar
import ipaddress
import socket
import sys
from typing import Any

import requests
import requests.adapters
import urllib3.connection
import urllib3.connectionpool
import urllib3.exceptions
import urllib3.poolmanager
from urllib3.util.connection import allowed_gai_family

from pin_orchestration.scraping.fetch.deadline import Deadline, current_fetch

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOWED_CIDRS_VARIABLE = "PIN_SCRAPING_ALLOWED_CIDRS"

# Ranges that `is_global` already excludes, named so the refusal never depends on how a
# Python release draws that line.
_ALWAYS_REFUSED_V4 = (
    ipaddress.IPv4Network("0.0.0.0/8"),
    ipaddress.IPv4Network("100.64.0.0/10"),
)
# NAT64's well-known prefix embeds an IPv4 address a NAT64 gateway would connect to.
_NAT64_PREFIX = ipaddress.IPv6Network("64:ff9b::/96")

# Host pools kept (LRU); a pool keeps at most as many idle connections as the fetches that
# ran against its host at once, capped here. Never blocking: a fetch beyond the cap opens
# its own connection instead of waiting for one.
_HOST_POOLS_KEPT = 64
_CONNECTIONS_KEPT_PER_HOST = 1024


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
        deadline: Deadline | None = getattr(current_fetch, "deadline", None)
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
        deadline: Deadline | None = getattr(current_fetch, "deadline", None)
        if deadline is not None:
            # The socket to shut at the deadline, as it is after any TLS wrapping.
            deadline.watch(self)


def _connect_timeout(timeout: Any, deadline: Deadline | None) -> float | None:
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
        # A kept connection has its socket already (client.py's
        # _sent_again_if_kept_connection_dropped sends again what such a one dropped).
        current_fetch.kept_connection = getattr(conn, "sock", None) is not None
        deadline: Deadline | None = getattr(current_fetch, "deadline", None)
        if deadline is not None:
            deadline.watch(conn)
        return conn

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            watching: Deadline | None = getattr(conn, "_pin_deadline", None)
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


def guarded_session(allowed_cidrs: tuple[IPNetwork, ...], user_agent: str) -> requests.Session:
    """A session whose every connection goes through the address check."""
    session = _OwnRedirectsSession()
    # No proxies, .netrc credentials or CA bundle overrides from the environment.
    session.trust_env = False
    session.cookies.set_policy(_NoCookies())
    session.headers["User-Agent"] = user_agent
    adapter = _GuardedAdapter(_AddressGuard(allowed_cidrs))
    for prefix in list(session.adapters):
        session.adapters.pop(prefix).close()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
