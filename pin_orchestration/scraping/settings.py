"""The scraping service's configuration, read from the environment when asked for.

Every variable has a default; a bad value raises SettingsError naming the variable and
what it accepts, so a process stops at start instead of misbehaving later.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from pin_orchestration.scraping.fetch import parse_allowed_cidrs
from pin_orchestration.scraping.repository import (
    MAX_DOMAIN_RPS,
    MIN_DOMAIN_RPS,
    DomainDefaults,
)
from pin_orchestration.settings import SettingsError

T = TypeVar("T")


@dataclass(frozen=True)
class ScrapingSettings:
    slots: int = 64
    fetch_timeout_seconds: float = 30.0
    max_attempts: int = 5
    backoff_base_seconds: float = 2.0
    backoff_cap_seconds: float = 600.0
    lease_seconds: float = 60.0
    allowed_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    max_result_bytes: int = 50 * 1024 * 1024
    max_worker_runs: int = 2
    # Politeness per target host, shared by every worker (README explains the defaults).
    domain_rps: float = 2.0
    domain_concurrency: int = 4
    # The longest pause a 429 / Retry-After (or anyone calling scraping.pause_domain) sets.
    max_pause_seconds: float = 3600.0
    s3_bucket: str | None = None
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    result_url_ttl_seconds: float = 900.0
    # Where clients reach the API; the local results store signs URLs under it.
    api_public_url: str = "http://127.0.0.1:8000"
    # The API's read cache of GET /jobs/{id}; None: every read goes to PostgreSQL.
    redis_url: str | None = None
    # Stored results older than this are deleted by pin_retention (GET …/result: 410); a
    # finished job stays in the read cache at most this long.
    result_retention_days: float = 30.0

    @property
    def domain_defaults(self) -> DomainDefaults:
        return DomainDefaults(rps=self.domain_rps, concurrency=self.domain_concurrency)

    webhook_timeout_seconds: float = 10.0
    webhook_max_attempts: int = 8
    # POST /jobs per tenant, shared by every API process (a token bucket in PostgreSQL):
    # `intake_rps` jobs/s sustained, `intake_burst` at once; 0 rps switches it off. The
    # defaults are the seed's whole peak intake (28 jobs/s) for one tenant, and a burst
    # that lets the seed's crawler post its 400 jobs at once (README, "Abuse limits").
    intake_rps: float = 28.0
    intake_burst: int = 400
    webhook_backoff_base_seconds: float = 5.0
    webhook_backoff_cap_seconds: float = 3600.0
    # The API's /metrics (tenant names, queue depths, failing hosts: operators' data) is
    # served only to a bearer of this token; unset, it is not served there at all and
    # operators scrape `pin metrics serve` on their own port.
    metrics_token: str | None = None
    # The database-derived scraping gauges are computed at most once per this many seconds,
    # whatever the scrape rate (each computation reads the queue).
    metrics_cache_seconds: float = 15.0
    # A finished job's copy in the read cache lives this long (bounded by the retention).
    cache_terminal_ttl_seconds: float = 3600.0
    # After `pin tenant webhook-secret --rotate`, the replaced secret signs too this long.
    webhook_secret_overlap_seconds: float = 86400.0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ScrapingSettings:
        env = os.environ if environ is None else environ
        d = cls()

        def read(name: str, parse: Callable[[str], T], default: T, accepts: str) -> T:
            raw = env.get(name)
            if raw is None or raw.strip() == "":
                return default
            try:
                return parse(raw.strip())
            except (ValueError, TypeError) as exc:
                raise SettingsError(
                    f"{name}={raw!r} is invalid: expected {accepts} (default {default!r}); {exc}"
                ) from None

        return cls(
            slots=read("PIN_SCRAPING_SLOTS", _positive_int, d.slots, "an integer > 0"),
            fetch_timeout_seconds=read(
                "PIN_SCRAPING_FETCH_TIMEOUT_SECONDS",
                _positive_float,
                d.fetch_timeout_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            max_attempts=read(
                "PIN_SCRAPING_MAX_ATTEMPTS", _positive_int, d.max_attempts, "an integer > 0"
            ),
            backoff_base_seconds=read(
                "PIN_SCRAPING_BACKOFF_BASE_SECONDS",
                _positive_float,
                d.backoff_base_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            backoff_cap_seconds=read(
                "PIN_SCRAPING_BACKOFF_CAP_SECONDS",
                _positive_float,
                d.backoff_cap_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            lease_seconds=read(
                "PIN_SCRAPING_LEASE_SECONDS",
                _positive_float,
                d.lease_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            allowed_cidrs=read(
                "PIN_SCRAPING_ALLOWED_CIDRS",
                parse_allowed_cidrs,
                d.allowed_cidrs,
                "a comma-separated list of CIDRs such as 127.0.0.1/32",
            ),
            max_result_bytes=read(
                "PIN_SCRAPING_MAX_RESULT_BYTES",
                _positive_int,
                d.max_result_bytes,
                "a number of bytes > 0",
            ),
            max_worker_runs=read(
                "PIN_SCRAPING_MAX_WORKER_RUNS",
                _positive_int,
                d.max_worker_runs,
                "an integer > 0",
            ),
            domain_rps=read(
                "PIN_SCRAPING_DOMAIN_RPS",
                _domain_rps,
                d.domain_rps,
                f"requests per second between {MIN_DOMAIN_RPS:g} and {MAX_DOMAIN_RPS:g}",
            ),
            domain_concurrency=read(
                "PIN_SCRAPING_DOMAIN_CONCURRENCY",
                _positive_int,
                d.domain_concurrency,
                "an integer > 0",
            ),
            max_pause_seconds=read(
                "PIN_SCRAPING_MAX_PAUSE_SECONDS",
                _positive_float,
                d.max_pause_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            s3_bucket=env.get("PIN_S3_BUCKET") or None,
            s3_endpoint_url=read(
                "PIN_S3_ENDPOINT_URL", _http_url, None, "an http(s):// URL of an S3 endpoint"
            ),
            s3_region=env.get("PIN_S3_REGION") or env.get("AWS_DEFAULT_REGION") or None,
            result_url_ttl_seconds=read(
                "PIN_RESULT_URL_TTL_SECONDS",
                _positive_float,
                d.result_url_ttl_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            api_public_url=read(
                "PIN_API_PUBLIC_URL",
                _http_url,
                d.api_public_url,
                "the http(s):// base URL clients use to reach the API",
            ).rstrip("/"),
            redis_url=read(
                "PIN_REDIS_URL",
                _redis_url,
                None,
                "a redis://HOST:PORT/DB, rediss:// or unix:// URL",
            ),
            webhook_timeout_seconds=read(
                "PIN_WEBHOOK_TIMEOUT_SECONDS",
                _positive_float,
                d.webhook_timeout_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            webhook_max_attempts=read(
                "PIN_WEBHOOK_MAX_ATTEMPTS", _positive_int, d.webhook_max_attempts, "an integer > 0"
            ),
            webhook_backoff_base_seconds=read(
                "PIN_WEBHOOK_BACKOFF_BASE_SECONDS",
                _positive_float,
                d.webhook_backoff_base_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            webhook_backoff_cap_seconds=read(
                "PIN_WEBHOOK_BACKOFF_CAP_SECONDS",
                _positive_float,
                d.webhook_backoff_cap_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            webhook_secret_overlap_seconds=read(
                "PIN_WEBHOOK_SECRET_OVERLAP_SECONDS",
                _non_negative_float,
                d.webhook_secret_overlap_seconds,
                "seconds >= 0 (0: the replaced secret stops signing at once)",
            ),
            intake_rps=read(
                "PIN_SCRAPING_INTAKE_RPS",
                _intake_rps,
                d.intake_rps,
                f"jobs per second per tenant, 0 (no limit) or between {MIN_INTAKE_RPS:g} "
                f"and {MAX_INTAKE_RPS:g}",
            ),
            intake_burst=read(
                "PIN_SCRAPING_INTAKE_BURST",
                _intake_burst,
                d.intake_burst,
                f"an integer between 1 and {MAX_INTAKE_BURST} (jobs a tenant may post at once)",
            ),
            metrics_token=read(
                "PIN_METRICS_TOKEN",
                _metrics_token,
                None,
                "a token of at least 16 characters (letters, digits, -._~+/=)",
            ),
            metrics_cache_seconds=read(
                "PIN_METRICS_CACHE_SECONDS",
                _non_negative_float,
                d.metrics_cache_seconds,
                "seconds >= 0 (0: computed at every scrape)",
            ),
            cache_terminal_ttl_seconds=read(
                "PIN_CACHE_TERMINAL_TTL_SECONDS",
                _positive_float,
                d.cache_terminal_ttl_seconds,
                "seconds > 0 (fractions allowed)",
            ),
            result_retention_days=read(
                "PIN_RESULT_RETENTION_DAYS",
                _positive_float,
                d.result_retention_days,
                "days > 0 (fractions allowed)",
            ),
        )


def _metrics_token(raw: str) -> str:
    if len(raw) < 16:
        raise ValueError("is shorter than 16 characters")
    if not raw.isascii() or not all(c.isalnum() or c in "-._~+/=" for c in raw):
        raise ValueError("has characters a bearer token cannot carry")
    return raw


def _non_negative_float(raw: str) -> float:
    value = float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be >= 0 and finite")
    return value


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if not value > 0 or value == float("inf"):
        raise ValueError("must be a finite number > 0")
    return value


def _non_negative_float(raw: str) -> float:
    value = float(raw)
    if not value >= 0 or value == float("inf"):
        raise ValueError("must be a finite number >= 0")
    return value


# Below this a refused client would be told to wait more than 1000 s.
MIN_INTAKE_RPS = 0.001
MAX_INTAKE_RPS = 1_000_000.0
MAX_INTAKE_BURST = 1_000_000


def _intake_rps(raw: str) -> float:
    value = float(raw)
    if value == 0:
        return 0.0
    if not MIN_INTAKE_RPS <= value <= MAX_INTAKE_RPS:
        raise ValueError("out of range")
    return value


def _intake_burst(raw: str) -> int:
    value = int(raw)
    if not 1 <= value <= MAX_INTAKE_BURST:
        raise ValueError("out of range")
    return value


def _redis_url(raw: str) -> str:
    if not raw.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("must start with redis://, rediss:// or unix://")
    return raw


def _domain_rps(raw: str) -> float:
    value = float(raw)
    if not MIN_DOMAIN_RPS <= value <= MAX_DOMAIN_RPS:
        raise ValueError("out of range")
    return value


def _http_url(raw: str) -> str:
    if not raw.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https://")
    return raw
