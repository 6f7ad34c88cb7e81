"""The URLs the fetcher sends a request to: a job's (or a webhook's) as given, and each
redirect hop's, which no intake has seen: it is held to intake's rules for a job's host
(fetch/hosts.py), since it is keyed by them for its politeness."""

from __future__ import annotations

from urllib.parse import urlsplit

from pin_orchestration.scraping.fetch.errors import FetchError
from pin_orchestration.scraping.fetch.hosts import host_key


def checked_hop(location: str) -> str:
    """`location` (a redirect's, resolved) if the fetcher may follow it; FetchError
    `invalid_url` otherwise."""
    url = checked_url(location, what="redirect location")
    _check_hop_host(url)
    return url


def checked_url(url: str, *, what: str) -> str:
    """`url` if it is an http(s) URL with a host and no credentials; FetchError
    `invalid_url` naming `what` otherwise."""
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
    if "@" in parts.netloc:
        # requests sends a URL's user:password@ as Basic auth. Intake refuses it in a job's
        # URL (fetch/hosts.py); a target's Location must not bring one in either: the
        # scraper would authenticate, as the target chose, at the host it chose. The
        # credentials are not repeated in the error, which the job's tenant reads.
        raise FetchError(
            "invalid_url",
            f"{what} to {parts.hostname[:200]!r} holds credentials (user:password@), "
            "which are never sent",
        ) from None
    return url


def _check_hop_host(url: str) -> None:
    """A hop's host is keyed for its politeness (rate, connections, robots.txt) as written:
    refused where intake refuses it in a job's URL (fetch/hosts.py), such as an IPv4
    address not written a.b.c.d (`127.1`, `2130706433`, `0x7f.0.0.1` all reach 127.0.0.1,
    each under a key, a rate and a robots.txt of its own)."""
    host = urlsplit(url).hostname or ""
    try:
        host_key(host, "redirect location")
    except ValueError as exc:
        raise FetchError("invalid_url", str(exc)) from None
