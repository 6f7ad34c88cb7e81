"""The scraping service's configuration, read from the environment when asked for.

Every variable has a default; a bad value raises SettingsError naming the variable and
what it accepts, so a process stops at start instead of misbehaving later. Each field is
declared once with its variable (`setting`, pin_orchestration/platform/options.py); the reader and
docs/configuration.md are derived from the declarations.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from pin_orchestration.platform.defaults import API_URL
from pin_orchestration.platform.options import NON_NEGATIVE, POSITIVE, Check, between, setting
from pin_orchestration.platform.settings import http_url, read_settings
from pin_orchestration.scraping.fetch.client import DEFAULT_USER_AGENT, product_token
from pin_orchestration.scraping.fetch.guard import parse_allowed_cidrs
from pin_orchestration.scraping.store.leases import DomainDefaults
from pin_orchestration.scraping.store.politeness import MAX_DOMAIN_RPS, MIN_DOMAIN_RPS

# Below this a refused client would be told to wait more than 1000 s.
MIN_INTAKE_RPS = 0.001
MAX_INTAKE_RPS = 1_000_000.0
MAX_INTAKE_BURST = 1_000_000

WORKER = "Scraping: worker runs and fetches"
POLITENESS = "Scraping: politeness per target host"
RESULTS = "Scraping: results store"
API = "Scraping: API, read cache, abuse limits, metrics"
WEBHOOKS = "Scraping: completion webhooks"


def _metrics_token(raw: str) -> str:
    if len(raw) < 16:
        raise ValueError("is shorter than 16 characters")
    if not raw.isascii() or not all(c.isalnum() or c in "-._~+/=" for c in raw):
        raise ValueError("has characters a bearer token cannot carry")
    return raw


def _redis_url(raw: str) -> str:
    if not raw.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError("")
    return raw


def _public_url(raw: str) -> str:
    return http_url(raw).rstrip("/")


def _robots_mode(raw: str) -> str:
    if raw not in ("obey", "ignore"):
        raise ValueError("")
    return raw


def _user_agent(raw: str) -> str:
    product_token(raw)
    if not raw.isascii() or not raw.isprintable():
        raise ValueError("has characters a header cannot carry")
    return raw


def _secret(raw: str) -> str:
    return f"a value of {len(raw)} characters"


@dataclass(frozen=True)
class ScrapingSettings:
    slots: int = setting(
        64,
        env="PIN_SCRAPING_SLOTS",
        help="concurrent fetches per scraping worker run",
        check=POSITIVE,
        group=WORKER,
    )
    max_worker_runs: int = setting(
        2,
        env="PIN_SCRAPING_MAX_WORKER_RUNS",
        help="scraping worker runs the sensor keeps at most",
        check=POSITIVE,
        group=WORKER,
    )
    fetch_timeout_seconds: float = setting(
        30.0,
        env="PIN_SCRAPING_FETCH_TIMEOUT_SECONDS",
        help="connect/read timeout and body deadline of one fetch",
        check=POSITIVE,
        unit="seconds",
        group=WORKER,
    )
    max_attempts: int = setting(
        5,
        env="PIN_SCRAPING_MAX_ATTEMPTS",
        help="attempts before a job fails for good",
        check=POSITIVE,
        group=WORKER,
    )
    backoff_base_seconds: float = setting(
        2.0,
        env="PIN_SCRAPING_BACKOFF_BASE_SECONDS",
        help="retry backoff (full jitter): the first delay",
        check=POSITIVE,
        unit="seconds",
        group=WORKER,
    )
    backoff_cap_seconds: float = setting(
        600.0,
        env="PIN_SCRAPING_BACKOFF_CAP_SECONDS",
        help="retry backoff (full jitter): the longest delay",
        check=POSITIVE,
        unit="seconds",
        group=WORKER,
    )
    lease_seconds: float = setting(
        60.0,
        env="PIN_SCRAPING_LEASE_SECONDS",
        help="a claimed job's lease, renewed every third of it",
        check=POSITIVE,
        unit="seconds",
        group=WORKER,
    )
    allowed_cidrs: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = setting(
        (),
        env="PIN_SCRAPING_ALLOWED_CIDRS",
        help="private/loopback ranges the scraper may reach (comma list)",
        parse=parse_allowed_cidrs,
        accepts="a comma-separated list of CIDRs such as 127.0.0.1/32",
        group=WORKER,
    )
    max_result_bytes: int = setting(
        50 * 1024 * 1024,
        env="PIN_SCRAPING_MAX_RESULT_BYTES",
        help="largest body stored",
        check=POSITIVE,
        unit="bytes",
        group=WORKER,
    )
    # Politeness per target host, shared by every worker (docs/jobs/scraping.md says why
    # these defaults).
    domain_rps: float = setting(
        2.0,
        env="PIN_SCRAPING_DOMAIN_RPS",
        help="requests per second per target host, shared by every worker (overrides: "
        "`pin scraping domain set`)",
        check=between(MIN_DOMAIN_RPS, MAX_DOMAIN_RPS),
        unit="requests per second",
        group=POLITENESS,
    )
    domain_concurrency: int = setting(
        4,
        env="PIN_SCRAPING_DOMAIN_CONCURRENCY",
        help="connections open at once per target host, shared by every worker",
        check=POSITIVE,
        group=POLITENESS,
    )
    max_pause_seconds: float = setting(
        3600.0,
        env="PIN_SCRAPING_MAX_PAUSE_SECONDS",
        help="the longest a 429 / Retry-After (or `pin scraping domain pause`) pauses a host "
        "for every worker",
        check=POSITIVE,
        unit="seconds",
        group=POLITENESS,
    )
    # robots.txt (RFC 9309), obeyed by default; an operator exempts one host with `pin
    # scraping domain robots HOST --ignore` (tenants cannot: docs/jobs/scraping.md).
    robots: str = setting(
        "obey",
        env="PIN_SCRAPING_ROBOTS",
        help="`obey`: every host's robots.txt (and its Crawl-delay) is fetched once for the "
        "fleet and obeyed; `ignore`: not fetched, nothing disallowed (a host's own `pin "
        "scraping domain robots` setting still wins)",
        parse=_robots_mode,
        accepts="obey or ignore",
        group=POLITENESS,
    )
    robots_retry_seconds: float = setting(
        60.0,
        env="PIN_SCRAPING_ROBOTS_RETRY_SECONDS",
        help="an unreachable robots.txt (5xx, no answer) disallows its host and is tried again "
        "after this, doubling per failure up to PIN_SCRAPING_MAX_PAUSE_SECONDS",
        check=POSITIVE,
        unit="seconds",
        group=POLITENESS,
    )
    user_agent: str = setting(
        DEFAULT_USER_AGENT,
        env="PIN_SCRAPING_USER_AGENT",
        help="the User-Agent of every fetch and webhook delivery; its first word (the product "
        "token) is the name robots.txt groups are matched against",
        parse=_user_agent,
        accepts="a User-Agent starting with a product token of letters, '_' and '-', such as "
        "`pin-scraper/0.1 (+https://example.com/bot)`",
        group=POLITENESS,
    )
    s3_bucket: str | None = setting(
        None,
        env="PIN_S3_BUCKET",
        help="results store in S3: the scraped results and the analysts' derived frames (Parquet)",
        shown="local store under `PIN_HOME`",
        group=RESULTS,
    )
    s3_endpoint_url: str | None = setting(
        None,
        env="PIN_S3_ENDPOINT_URL",
        help="endpoint of an S3-compatible results store (MinIO, …)",
        parse=http_url,
        accepts="an http(s):// URL of an S3 endpoint",
        shown="AWS S3",
        group=RESULTS,
    )
    s3_region: str | None = setting(
        None,
        env=("PIN_S3_REGION", "AWS_DEFAULT_REGION"),
        help="region of the S3 results store",
        shown="the AWS SDK's",
        group=RESULTS,
    )
    result_url_ttl_seconds: float = setting(
        900.0,
        env="PIN_RESULT_URL_TTL_SECONDS",
        help="validity of a result download URL",
        check=POSITIVE,
        unit="seconds",
        group=RESULTS,
    )
    # A finished job stays in the read cache at most this long too.
    result_retention_days: float = setting(
        30.0,
        env="PIN_RESULT_RETENTION_DAYS",
        help="stored results older than this are deleted by `pin_retention` (their `/result` "
        "answers 410)",
        check=POSITIVE,
        unit="days",
        group=RESULTS,
    )
    # The local results store signs URLs under it.
    api_public_url: str = setting(
        API_URL,
        env="PIN_API_PUBLIC_URL",
        help="where clients reach the API (local result URLs are signed under it)",
        parse=_public_url,
        accepts="the http(s):// base URL clients use to reach the API",
        shown=f"`http://HOST:PORT` of `pin api` (elsewhere `{API_URL}`)",
        group=API,
    )
    redis_url: str | None = setting(
        None,
        env="PIN_REDIS_URL",
        help="Redis of the API's read cache of `GET /jobs/{id}` (`redis://HOST:PORT/DB`)",
        parse=_redis_url,
        accepts="a redis://HOST:PORT/DB, rediss:// or unix:// URL",
        shown="no cache: every read goes to PostgreSQL",
        group=API,
    )
    cache_terminal_ttl_seconds: float = setting(
        3600.0,
        env="PIN_CACHE_TERMINAL_TTL_SECONDS",
        help="a finished job's copy in the read cache lives this long (never past its "
        "results' retention)",
        check=POSITIVE,
        unit="seconds",
        group=API,
    )
    # A token bucket in PostgreSQL shared by every API process. The defaults are the seed's
    # whole peak intake (28 jobs/s) for one tenant, and a burst that lets the seed's
    # crawler post its 400 jobs at once (docs/jobs/scraping.md, "Abuse limits").
    intake_rps: float = setting(
        28.0,
        env="PIN_SCRAPING_INTAKE_RPS",
        help="`POST /jobs` per tenant: jobs/s sustained, shared by every API process (`0`: "
        "no limit)",
        check=Check(
            f"0 (no limit) or between {MIN_INTAKE_RPS:g} and {MAX_INTAKE_RPS:g}",
            lambda rps: rps == 0 or MIN_INTAKE_RPS <= rps <= MAX_INTAKE_RPS,
        ),
        unit="jobs per second per tenant,",
        group=API,
    )
    intake_burst: int = setting(
        400,
        env="PIN_SCRAPING_INTAKE_BURST",
        help="`POST /jobs` per tenant: jobs at once, shared by every API process",
        check=between(1, MAX_INTAKE_BURST),
        group=API,
    )
    # Operators' data (tenant names, queue depths, failing hosts): unset, the API does not
    # serve /metrics at all and operators scrape `pin metrics serve` on their own port.
    metrics_token: str | None = setting(
        None,
        env="PIN_METRICS_TOKEN",
        help="bearer token the API's `/metrics` wants (at least 16 characters); `pin metrics "
        "serve` needs none",
        parse=_metrics_token,
        accepts="a token of at least 16 characters (letters, digits, -._~+/=)",
        shown="the API serves no `/metrics`",
        group=API,
        redact=_secret,
    )
    # Each computation reads the queue, whatever the scrape rate.
    metrics_cache_seconds: float = setting(
        15.0,
        env="PIN_METRICS_CACHE_SECONDS",
        help="the database-derived `scraping_*` gauges are computed at most once per this "
        "many seconds (0: every scrape)",
        check=NON_NEGATIVE,
        unit="seconds",
        group=API,
    )
    webhook_timeout_seconds: float = setting(
        10.0,
        env="PIN_WEBHOOK_TIMEOUT_SECONDS",
        help="connect/read timeout and deadline of one webhook delivery",
        check=POSITIVE,
        unit="seconds",
        group=WEBHOOKS,
    )
    webhook_max_attempts: int = setting(
        8,
        env="PIN_WEBHOOK_MAX_ATTEMPTS",
        help="delivery attempts of a completion webhook before it is given up",
        check=POSITIVE,
        group=WEBHOOKS,
    )
    webhook_backoff_base_seconds: float = setting(
        5.0,
        env="PIN_WEBHOOK_BACKOFF_BASE_SECONDS",
        help="webhook retry backoff (full jitter): the first delay",
        check=POSITIVE,
        unit="seconds",
        group=WEBHOOKS,
    )
    webhook_backoff_cap_seconds: float = setting(
        3600.0,
        env="PIN_WEBHOOK_BACKOFF_CAP_SECONDS",
        help="webhook retry backoff (full jitter): the longest delay",
        check=POSITIVE,
        unit="seconds",
        group=WEBHOOKS,
    )
    webhook_secret_overlap_seconds: float = setting(
        86400.0,
        env="PIN_WEBHOOK_SECRET_OVERLAP_SECONDS",
        help="after `pin tenant webhook-secret NAME --rotate`, deliveries carry a signature "
        "with the replaced secret too for this long (`0`: not at all)",
        check=NON_NEGATIVE,
        unit="seconds",
        group=WEBHOOKS,
    )

    @property
    def domain_defaults(self) -> DomainDefaults:
        return DomainDefaults(rps=self.domain_rps, concurrency=self.domain_concurrency)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ScrapingSettings:
        return read_settings(cls, environ)
