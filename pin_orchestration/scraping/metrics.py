"""The scraping service's metrics for Prometheus (SCR-12, seed step 31).

`ScrapingCollector` reads PostgreSQL at scrape time (worker runs are short-lived
processes and keep nothing), so `pin metrics serve` and the API's `/metrics` (for the
bearer of PIN_METRICS_TOKEN only) expose the same figures; it computes them at most once per
PIN_METRICS_CACHE_SECONDS, whatever the scrape rate (the queries read the queue).
`JobCacheCollector` is the exception: the read cache's hits and misses are counted in the
API process that served them, so only that process's `/metrics` has them.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from pin_orchestration.platform.sql import NamedQueries

if TYPE_CHECKING:
    # The cache's module loads the Redis client (~0.2 s of CPU); the code location, which
    # imports this module for its collectors, never makes a cache.
    from pin_orchestration.scraping.api.cache import JobCache

# The window of time-to-first-attempt p95 and of the failure shares.
RECENT_WINDOW_SECONDS = 15 * 60
# A crawler can touch thousands of hosts: only the ones failing most become series.
TOP_FAILING_DOMAINS = 20


_q = NamedQueries("pin_orchestration.scraping", "metrics.sql")


def _window_start_id(window_seconds: float) -> uuid.UUID:
    """The smallest UUIDv7 of the window's first millisecond: ids are time-ordered, so
    `id >= this` selects the jobs accepted since then as a primary-key range."""
    start_ms = int((time.time() - window_seconds) * 1000)
    return uuid.UUID(int=(start_ms << 80) | (0x7 << 76) | (0b10 << 62))


class ScrapingCollector(Collector):
    """scraping_* gauges, one short read of PostgreSQL per cache period."""

    def __init__(
        self,
        engine: Engine,
        *,
        window_seconds: float = RECENT_WINDOW_SECONDS,
        cache_seconds: float | None = None,
    ) -> None:
        if cache_seconds is None:
            from pin_orchestration.scraping.settings import ScrapingSettings

            cache_seconds = ScrapingSettings.from_env().metrics_cache_seconds
        self.engine = engine
        self.window_seconds = window_seconds
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._computed: tuple[float, list[Metric]] | None = None

    def collect(self) -> Iterator[Metric]:
        # Concurrent scrapes wait for one computation instead of each running the queries.
        with self._lock:
            now = time.monotonic()
            if self._computed is None or now - self._computed[0] >= self.cache_seconds:
                self._computed = (now, list(self._compute()))
            metrics = self._computed[1]
        yield from metrics

    def _compute(self) -> Iterator[Metric]:
        since_id = _window_start_id(self.window_seconds)
        with self.engine.connect() as conn:
            depth = conn.execute(_q("queue_depth")).all()
            oldest = conn.execute(_q("oldest_due_age")).scalar_one()
            past_lease = conn.execute(_q("running_past_lease")).scalar_one()
            ttfa = conn.execute(_q("time_to_first_attempt_p95"), {"since_id": since_id}).one()
            attempts = conn.execute(
                _q("recent_attempt_failures"), {"window_seconds": self.window_seconds}
            ).all()
        window = f"{self.window_seconds / 60:g} min"

        queue = GaugeMetricFamily(
            "scraping_queue_depth",
            "Queued jobs per tenant and priority (due or in retry backoff)",
            labels=["tenant", "priority"],
        )
        for row in depth:
            queue.add_metric([row.tenant, row.priority], row.jobs)
        yield queue
        yield GaugeMetricFamily(
            "scraping_oldest_queued_job_age_seconds",
            "How long the longest-waiting due job has waited since it fell due (0: none)",
            value=float(oldest),
        )
        yield GaugeMetricFamily(
            "scraping_jobs_running_past_lease",
            "Jobs in running whose lease expired (a dead worker; the sweeper requeues them)",
            value=past_lease,
        )
        yield GaugeMetricFamily(
            "scraping_time_to_first_attempt_p95_seconds",
            f"p95 of accept → first attempt over jobs accepted in the last {window} "
            "(jobs still waiting count with their wait so far)",
            value=float(ttfa.p95 or 0.0),
        )
        yield GaugeMetricFamily(
            "scraping_time_to_first_attempt_jobs",
            f"Jobs the time-to-first-attempt p95 is computed over (last {window})",
            value=ttfa.jobs,
        )
        yield from _failure_shares(attempts, window)


def _failure_shares(rows: list[Any], window: str) -> Iterator[Metric]:
    total = sum(r.attempts for r in rows)
    by_class: Counter[str] = Counter()
    domain_attempts: Counter[str] = Counter()
    domain_failures: Counter[str] = Counter()
    for r in rows:
        domain_attempts[r.domain or ""] += r.attempts
        if r.failed:
            by_class[r.error_class] += r.attempts
            domain_failures[r.domain or ""] += r.attempts
    classes = GaugeMetricFamily(
        "scraping_failure_share_by_class",
        f"Share of the attempts ended in the last {window} that failed with this class",
        labels=["error_class"],
    )
    for error_class, failures in sorted(by_class.items()):
        classes.add_metric([error_class], failures / total)
    yield classes
    domains = GaugeMetricFamily(
        "scraping_failure_share_by_domain",
        f"Share of a target host's attempts ended in the last {window} that failed "
        f"(the {TOP_FAILING_DOMAINS} hosts with most failures)",
        labels=["domain"],
    )
    top = sorted(domain_failures.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FAILING_DOMAINS]
    for domain, failures in top:
        domains.add_metric([domain], failures / domain_attempts[domain])
    yield domains
    yield GaugeMetricFamily(
        "scraping_attempts_recent",
        f"Attempts ended in the last {window} (the failure shares' denominator)",
        value=total,
    )


class JobCacheCollector(Collector):
    """scraping_job_cache_*: this API process's read-cache counters."""

    def __init__(self, cache: JobCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        stats = self.cache.stats()
        yield CounterMetricFamily(
            "scraping_job_cache_hits", "GET /jobs/{id} answered from Redis", value=stats.hits
        )
        yield CounterMetricFamily(
            "scraping_job_cache_misses",
            "GET /jobs/{id} answered from PostgreSQL (Redis missing, skipped or failing)",
            value=stats.misses,
        )
        yield CounterMetricFamily(
            "scraping_job_cache_errors",
            "Redis calls of the read cache that failed",
            value=stats.errors,
        )
        yield CounterMetricFamily(
            "scraping_job_cache_invalidations",
            "Job-finished events applied to the cache",
            value=stats.invalidations,
        )
        yield GaugeMetricFamily(
            "scraping_job_cache_hit_ratio",
            "hits / (hits + misses) since this API process started",
            value=stats.hit_ratio,
        )
