"""What a robots.txt says (RFC 9309), apart from where it is kept: the origin a URL's rules
come from, how long a fetched file is kept, the group that applies to our product token,
its Crawl-delay, and the rule that matches a URL. Pure functions over protego's parser.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from protego import Protego

from pin_orchestration.scraping.fetch.client import product_token
from pin_orchestration.scraping.store.politeness import normalize_host

log = logging.getLogger(__name__)

# Section 2.4: a robots.txt is cached at most 24 h. The floor keeps a host answering
# `max-age=0` from being asked before every job.
MAX_TTL_SECONDS = 24 * 3600.0
MIN_TTL_SECONDS = 60.0
# A Crawl-delay's bounds (crawl_delay_of).
MIN_CRAWL_DELAY_SECONDS = 0.001
MAX_CRAWL_DELAY_SECONDS = 24 * 3600.0


def origin_of(url: str) -> str:
    """scheme://host:port of a URL, with the scheme's default port written out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    host = normalize_host(parts.hostname or "")
    port = parts.port or (443 if scheme == "https" else 80)
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}:{port}"


def ttl_seconds(headers: Any) -> float:
    """How long a fetched robots.txt is kept: its Cache-Control max-age within the bounds."""
    for directive in str(headers.get("cache-control") or "").split(","):
        name, _, value = directive.strip().partition("=")
        if name.strip().lower() == "max-age":
            try:
                seconds = float(value.strip().strip('"'))
            except ValueError:
                break
            if math.isnan(seconds):  # a number to Python, no interval to PostgreSQL
                break
            return min(max(seconds, MIN_TTL_SECONDS), MAX_TTL_SECONDS)
    return MAX_TTL_SECONDS


class RobotsRules(Protego):
    """protego's parser, its rules and matching, with RFC 9309's choice of group (section
    2.2.1): the group whose user-agent is our product token, case-insensitively (a line's
    own product token: `pin-scraper/2.0` is `pin-scraper`), else the `*` group, else none.
    protego takes the group whose name begins any word of the name it is given (made for
    whole User-Agent headers): `User-agent: pin` (another crawler) was ours, and let us into
    what `*` disallows; `User-agent: pin-scraper/2.0` was not, and its Disallow went
    unobeyed."""

    def _get_matching_rule_set(self, user_agent: str) -> Any:
        token = user_agent.strip().lower()
        groups = self._user_agents
        for name, group in groups.items():
            if name != "*" and _leading_token(name) == token:
                return group
        return groups.get("*")


def _leading_token(name: str) -> str:
    try:
        return product_token(name)
    except ValueError:  # no product token: no crawler's group
        return ""


def crawl_delay_of(parser: Protego, token: str) -> float | None:
    """The group's Crawl-delay in seconds, kept to what the host's rate can use: at most a
    day (past ~91 s the rate's floor of 0.01 per second binds anyway); under a millisecond,
    none. Unbounded, 1 / (delay x 1.1) overflowed PostgreSQL's double precision for 1.7e308
    and for a denormal like 1e-320: the store failed, and every job of the host asked for
    robots.txt again."""
    delay = parser.crawl_delay(token)
    if delay is None or not math.isfinite(delay) or delay < MIN_CRAWL_DELAY_SECONDS:
        return None
    return min(delay, MAX_CRAWL_DELAY_SECONDS)


# RFC 3986 section 2.3: unreserved characters, the same decoded or percent-encoded.
_ENCODED_UNRESERVED = re.compile(r"%(?:[46][1-9A-Fa-f]|[57][0-9Aa]|3[0-9]|2[Dd]|2[Ee]|5[Ff]|7[Ee])")


def readings(url: str) -> list[str]:
    """`url` as sent, and as a server reads its path when that differs: unreserved
    characters decoded (the fetcher sends `%2E` as `.`), dot segments resolved (RFC 3986
    section 5.2.4) and runs of slashes merged (nginx's default). RFC 9309 compares the path
    as written; a client could then write a disallowed path the check did not recognise
    (`/x/%2e%2e/private`, `//private`) and the server served it. Each reading is judged;
    any disallowed one refuses the URL."""
    parts = urlsplit(url)
    path = _ENCODED_UNRESERVED.sub(lambda m: chr(int(m.group(0)[1:], 16)), parts.path)
    path = re.sub(r"/{2,}", "/", _remove_dot_segments(path)) or "/"
    if path == parts.path:
        return [url]
    return [url, urlunsplit(parts._replace(path=path))]


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 section 5.2.4, for an absolute path."""
    kept: list[str] = []
    segments = path.split("/")
    for segment in segments[1:]:
        if segment == "..":
            if kept:
                kept.pop()
        elif segment != ".":
            kept.append(segment)
    ends_in_dir = segments[-1] in (".", "..")
    return "/" + "/".join(kept) + ("/" if ends_in_dir and kept else "")


def robots_text(raw: bytes) -> str:
    """A robots.txt body as text to parse and store: UTF-8 (RFC 9309 section 2.3), a byte
    order mark dropped (left in, it hid the first line, a User-agent, from the parser, and
    its group's rules were not obeyed), NUL bytes dropped (PostgreSQL's text cannot hold
    them: storing failed and every job of the host asked for robots.txt again)."""
    return raw.decode("utf-8-sig", errors="replace").replace("\x00", "")


def matched_rule(parser: Protego, url: str, token: str) -> str:
    """The rule that disallows `url` for `token`, as a person reads it. protego answers
    allowed or not; which rule decided is read from its group the way it decides."""
    try:
        from protego._utils import _quote_path

        group = parser._get_matching_rule_set(token)
        if group is not None:
            path = _quote_path(url)
            for rule in group._rules:
                if rule.value.match(path):
                    field = "Disallow" if rule.field == "disallow" else "Allow"
                    return f"{field}: {rule.value._pattern} (group User-agent: {group.user_agent})"
    except Exception:  # protego's internals moved: the verdict stands, the detail is lost
        log.debug("could not name the matching robots.txt rule", exc_info=True)
    return f"a Disallow rule of the group matching {token!r}"
