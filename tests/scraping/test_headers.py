"""The defensive header parsers: what a remote party writes in a header never raises."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pin_orchestration.scraping.fetch.headers import (
    content_length_error,
    parse_content_length,
    parse_retry_after,
    resolve_location,
)

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", NOW),
        ("30", NOW + timedelta(seconds=30)),
        (" 30 ", NOW + timedelta(seconds=30)),
        ("Mon, 30 Nov 2026 12:00:45 GMT", NOW + timedelta(seconds=45)),  # IMF-fixdate
        ("Monday, 30-Nov-26 12:00:45 GMT", NOW + timedelta(seconds=45)),  # RFC 850
        ("Mon Nov 30 12:00:45 2026", NOW + timedelta(seconds=45)),  # asctime
        (None, None),
        ("", None),
        ("-5", None),
        ("1.5", None),
        ("soon", None),
        ("Mon, 31 Nov 2026 12:00:45 GMT", None),
        ("99999999999999999999999", None),
        # A valid date whose move to UTC leaves datetime's range (OverflowError).
        ("Fri, 31 Dec 9999 23:59:59 -0100", None),
        # Digits that are not ASCII: str.isdigit() says yes, the grammar says no.
        ("²", None),
        ("١٢", None),
        ("9" * 5000, None),
    ],
)
def test_parse_retry_after(value: str | None, expected: datetime | None) -> None:
    assert parse_retry_after(value, NOW) == expected


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        parse_retry_after("5", NOW.replace(tzinfo=None))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0),
        ("42", 42),
        (" 42\t", 42),
        ("42, 42", 42),
        ("99999999999999999999", 99999999999999999999),
        (None, None),
        ("", None),
        ("²", None),  # "²".isdigit() is true, int("²") raises
        ("١٢", None),  # int("١٢") is 12
        ("-1", None),
        ("+1", None),
        ("1.0", None),
        ("0x10", None),
        ("1_000", None),
        ("42, 43", None),
        ("9" * 5000, None),
    ],
)
def test_parse_content_length(value: str | None, expected: int | None) -> None:
    assert parse_content_length(value) == expected


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.text())
def test_no_header_value_raises(value: str) -> None:
    length = parse_content_length(value)
    assert length is None or length >= 0
    moment = parse_retry_after(value, NOW)
    assert moment is None or moment.tzinfo is not None
    location = resolve_location(value, "http://a.test/start")
    assert location is None or location.isprintable()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("/next", "http://a.test/next"),
        ("https://b.test/x?y=1", "https://b.test/x?y=1"),
        ("caf\u00c3\u00a9", "http://a.test/café"),  # UTF-8 bytes, read as latin-1
        (None, None),
        ("", None),
        ("http://[::1", None),  # urljoin raises ValueError
        ("/\u00ff\u00fe", None),  # not UTF-8
        ("/a\u0000b", None),
    ],
)
def test_resolve_location(value: str | None, expected: str | None) -> None:
    assert resolve_location(value, "http://a.test/start") == expected


@pytest.mark.parametrize(
    ("status", "content_length", "transfer_encoding", "invalid"),
    [
        (200, "42", None, False),
        (200, None, None, False),
        (200, "42, 42", None, False),
        (200, "²", None, True),
        (200, "-5", None, True),
        (200, "0x10", None, True),
        (200, "", None, True),
        (200, "3, 7", None, True),
        (503, "-1", None, True),
        # Transfer-Encoding overrides it; these statuses have no body whatever it says.
        (200, "-5", "chunked", False),
        (204, "-5", None, False),
        (304, "x", None, False),
        (101, "x", None, False),
    ],
)
def test_content_length_error(
    status: int, content_length: str | None, transfer_encoding: str | None, invalid: bool
) -> None:
    error = content_length_error(status, content_length, transfer_encoding)
    assert (error is not None) == invalid
