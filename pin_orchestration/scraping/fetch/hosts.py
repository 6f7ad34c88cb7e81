"""What a job's URL may be, and the host its politeness limits are keyed by (issue 30):
the one definition every door uses — POST /jobs and /jobs/batch through `check_url`, the
domain commands through `host_key`; scraping.submit_job (scraping/sql/submit_job.sql) is
the same rules in SQL, held equal to this module by tests/scraping/test_intake_differential.py.

The key is the host as the fetcher resolves it: `requests` sends a URL whose host urllib3
has normalised (`urllib3.util.url._normalize_host`: an ASCII label lowercased, any other
label `idna.encode(label.lower(), strict=True, std3_rules=True)`, IDNA 2008), and a 429
pauses that host (the worker keys it without its trailing dot). The grammar below keeps
to URLs on which Python's `urlsplit`, urllib3 and SQL's regular expressions read the same
authority: no userinfo, no backslash, no percent-encoding in the host, a port of 1 to 5
digits. A URL outside it is refused, naming the field; a URL inside it the fetcher accepts.
"""

from __future__ import annotations

import functools
import ipaddress
import re

import idna

MAX_URL_LENGTH = 2048

# Never in a URL: C0 controls, space, DEL, C1 controls, and every other character
# str.isspace calls whitespace (urlsplit strips leading C0 controls and spaces, so
# "\x01http://…" would be read as http:// by one parser and not by another).
_FORBIDDEN_CHARS = "\x00-\x20\x7f-\x9f\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_FORBIDDEN = re.compile(f"[{_FORBIDDEN_CHARS}]")
# scheme://authority then the rest; the authority ends at the first / ? or #.
_URL = re.compile(r"([Hh][Tt][Tt][Pp][Ss]?)://([^/?#]*)(.*)", re.DOTALL)
_SCHEME_ONLY = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
# host[:port]: an IPv6 literal in brackets (no zone id) or a name; the port 0-5 digits.
_AUTHORITY = re.compile(r"(\[[0-9A-Fa-f:]*\]|[^:\[\]]*)(?::([0-9]*))?")
# An ASCII name: letters, digits, '-' and '_' in dot-separated labels of at most 63
# (DNS's limit: urllib3 refuses a longer label when it connects), one trailing dot.
_ASCII_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?")
# A name getaddrinfo may read as an IPv4 address (inet_aton: 1 to 4 parts, each decimal,
# 0x hex or 0 octal), and the one spelling of it accepted, a.b.c.d: 0x7f.1, 127.1 and
# 2130706433 are all 127.0.0.1, and one address under many keys gets many rates.
_NUMERIC_HOST = re.compile(
    r"(?:0[xX][0-9A-Fa-f]*|[0-9]+)(?:\.(?:0[xX][0-9A-Fa-f]*|[0-9]+)){0,3}\.?"
)
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"(?:{_OCTET}\.){{3}}{_OCTET}\.?")
# A name with non-ASCII labels: each label free of the characters above that have a
# meaning in a URL or DNS (the IDNA check refuses the rest).
_NAME = re.compile(r"[^.%@\\/?#:\[\]]+(?:\.[^.%@\\/?#:\[\]]+)*\.?")


def check_url(value: str, field: str) -> str:
    """`value` if it is a URL a job may have in `field` (url, callback_url): ValueError
    naming the field and the fix otherwise. Returns the URL's host key."""
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"{field} is longer than {MAX_URL_LENGTH} characters")
    bad = _FORBIDDEN.search(value)
    if bad:
        raise ValueError(
            f"{field} must not contain whitespace or control characters (found "
            f"U+{ord(bad.group()):04X} at position {bad.start()}): percent-encode it"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{field} contains a lone UTF-16 surrogate (such as \\ud800), which is not text: "
            "percent-encode the bytes you mean"
        ) from None
    return _url_host_key(value, field)


@functools.lru_cache(maxsize=2048)
def _url_host_key(value: str, field: str) -> str:
    # Memoized: a batch's URLs are checked by its validation, keyed again for its insert.
    parts = _URL.fullmatch(value)
    if parts is None:
        raise ValueError(f"{field} must be an http:// or https:// URL")
    authority = parts.group(2)
    if "@" in authority:
        # They would be stored and shown in every read of the job (and sent on redirects).
        raise ValueError(
            f"{field}: credentials in a URL are not accepted (remove the user:password@ part)"
        )
    if "\\" in authority:
        raise ValueError(f"{field} has a backslash in its host: write / or percent-encode it")
    hostport = _AUTHORITY.fullmatch(authority)
    if hostport is None:
        raise ValueError(f"{field} has an invalid host or port: {authority[:80]!r}")
    host, port = hostport.group(1), hostport.group(2)
    if port and (len(port) > 5 or not 1 <= int(port) <= 65535):
        raise ValueError(f"{field} has an invalid port {port!r}: give 1 to 65535")
    if not host or host == "[]":
        raise ValueError(f"{field} has no host")
    return host_key(host, field)


def ipv6_key(address: ipaddress.IPv6Address) -> str:
    """One key per address, whatever its spelling (`::1`, `0:0:0:0:0:0:0:1`, `::0001`):
    the compressed form RFC 5952 gives (lowercase hex, no leading zeros, the longest run of
    two or more zero groups as `::`, the first of equal runs), as `ipaddress` writes it; an
    IPv4-mapped address (`::ffff:7f00:1`) is the IPv4 address it reaches (`127.0.0.1`).
    scraping.ipv6_key (scraping/sql/submit_job.sql) is the same in SQL."""
    mapped = address.ipv4_mapped
    return str(mapped) if mapped is not None else str(address)


def host_key(host: str, field: str = "the host") -> str:
    """The key of a host as written in a URL (an IPv6 literal in brackets or not): what
    the fetcher connects to, lowercased, without the trailing dot (an IPv6 address in its
    one canonical spelling, `ipv6_key`). ValueError naming
    `field` for a host outside check_url's grammar or one IDNA 2008 refuses."""
    bracketed = host.startswith("[")
    if bracketed:
        if not host.endswith("]"):
            raise ValueError(f"{field} has an unclosed IPv6 literal")
        host = host[1:-1]
    if bracketed or ":" in host:
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{field} has an invalid IPv6 address {host[:80]!r}") from None
        return ipv6_key(address)
    if _ASCII_NAME.fullmatch(host):
        if _NUMERIC_HOST.fullmatch(host) and not _DOTTED_QUAD.fullmatch(host):
            raise ValueError(
                f"{field} has an IPv4 address not written as a.b.c.d ({host[:80]!r}): give "
                "four decimal numbers 0 to 255 without leading zeros"
            )
        return host.lower().rstrip(".")
    if host.isascii() or not _NAME.fullmatch(host):
        raise ValueError(
            f"{field} has a host that is not a valid name ({host[:80]!r}): use letters, "
            "digits, '-', '_' and dots, at most 63 characters between dots"
        )
    labels = []
    for label in host.rstrip(".").split("."):
        if label.isascii():
            if not _ASCII_NAME.fullmatch(label):
                raise ValueError(
                    f"{field} has an invalid label {label[:63]!r} in its host: use letters, "
                    "digits, '-' and '_', at most 63 characters"
                )
            labels.append(label.lower())
            continue
        try:
            # As urllib3 encodes the label for requests: IDNA 2008, lowercased first.
            labels.append(idna.encode(label.lower(), strict=True, std3_rules=True).decode())
        except idna.IDNAError as exc:
            raise ValueError(
                f"{field} has a host that is not a valid internationalised name "
                f"(IDNA 2008: {exc}); give its label {label[:63]!r} as written in DNS "
                "(xn--…)"
            ) from None
    return ".".join(labels)
