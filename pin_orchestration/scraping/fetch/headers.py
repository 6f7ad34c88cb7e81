"""Defensive parsers for the HTTP headers a remote party controls.

A scraping target (or a webhook receiver) chooses every byte of its answer's headers, so
a value is parsed by the grammar RFC 9110 gives it and nothing looser: whatever does not
match is `None` — the header is treated as absent — and never an exception. Callers decide
what an absent or invalid value means (a body limit still applies to a body with no
length; a Retry-After is capped by the caller's own limit).

Python's own helpers are too lenient here: `str.isdigit()` and `int()` accept non-ASCII
digits (`"²".isdigit()` is true and `int("²")` raises; `int("١٢")` is 12), and
`email.utils.parsedate_to_datetime` returns dates that overflow once moved to UTC
(`Fri, 31 Dec 9999 23:59:59 -0100`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin

# RFC 9110 §8.6: Content-Length = 1*DIGIT, DIGIT being ASCII 0-9.
_ASCII_DIGITS = re.compile(r"[0-9]+")
# A value longer than this is no length a body of ours could have (and int() of a huge
# digit string is slow: CPython refuses past 4,300 digits anyway).
_MAX_DIGITS = 30
# RFC 9110 §5.5: optional whitespace around a field value is space or horizontal tab.
_OWS = " \t"


def parse_content_length(value: str | None) -> int | None:
    """The body length a `Content-Length` value declares, or `None` when it declares none
    usable: absent, empty, not ASCII digits, too long, or a list whose members differ
    (RFC 9110 §8.6 lets a recipient take `"42, 42"` as 42)."""
    if value is None:
        return None
    members = {member.strip(_OWS) for member in value.split(",")}
    if len(members) != 1:
        return None
    (text,) = members
    if len(text) > _MAX_DIGITS or not _ASCII_DIGITS.fullmatch(text):
        return None
    return int(text)


def content_length_error(
    status_code: int, content_length: str | None, transfer_encoding: str | None
) -> str | None:
    """Why an answer's `Content-Length` leaves it without framing, or `None` when it does
    not: RFC 9112 §6.3 makes an answer without Transfer-Encoding whose Content-Length is
    invalid an unrecoverable error for a user agent (read to the close instead, its bytes
    would pass for a body). Absent, next to a Transfer-Encoding (which overrides it), or on
    a 1xx/204/304 (which have no body whatever it says), the header frames nothing."""
    if content_length is None or transfer_encoding is not None:
        return None
    if status_code < 200 or status_code in (204, 304):
        return None
    if parse_content_length(content_length) is not None:
        return None
    return f"Content-Length {content_length[:50]!r} is no length (RFC 9112 §6.3)"


def parse_retry_after(value: str | None, now: datetime) -> datetime | None:
    """The moment a `Retry-After` value points at, or `None` if it says nothing usable.

    Either delay-seconds (ASCII digits only) counted from `now`, or an HTTP-date in any of
    the three forms RFC 9110 §5.6.7 makes recipients accept. Garbage, negative or
    fractional delays, impossible dates and anything past what a `datetime` holds → `None`.
    A date in the past is returned as is: it simply does not hold anything back. The
    result is not capped: a caller bounds it by its own limit.
    """
    if now.tzinfo is None:
        raise ValueError("now must be timezone-aware (UTC)")
    if value is None:
        return None
    text = value.strip(_OWS)
    if not text:
        return None
    if _ASCII_DIGITS.fullmatch(text):
        if len(text) > _MAX_DIGITS:
            return None
        try:
            return now + timedelta(seconds=int(text))
        except OverflowError:
            return None
    try:
        moment = parsedate_to_datetime(text)
        if moment.tzinfo is None:
            # The asctime form carries no zone; HTTP-dates are always GMT.
            moment = moment.replace(tzinfo=UTC)
        return moment.astimezone(UTC)
    except (TypeError, ValueError, IndexError, OverflowError):
        # OverflowError: a date at the edge of datetime's range moved across a zone.
        return None


def resolve_location(value: str | None, base_url: str) -> str | None:
    """The absolute URL a `Location` value points at, resolved against `base_url` (the
    URL that answered), or `None` when it points nowhere usable: absent, empty, not UTF-8
    (header bytes arrive as latin-1 text), or not parseable as a URL reference (`http://[::1`
    makes urljoin raise). Whether the URL may be fetched (scheme, host, port) is the
    caller's check."""
    if value is None:
        return None
    try:
        text = value.encode("latin-1").decode("utf-8").strip(_OWS)
    except UnicodeError:
        return None
    if not text or not text.isprintable():
        return None
    try:
        return urljoin(base_url, text)
    except ValueError:
        return None
