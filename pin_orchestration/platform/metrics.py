"""Prometheus exposition of the seeds' metrics (`pin metrics serve`).

Job runs are short-lived processes, so every figure is read from durable state in
PostgreSQL at scrape time by custom collectors — nothing lives in process memory. An
area adds its collector to `collectors()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Engine, text

from pin_orchestration.coordination.jobruns import RUN_DURATION_BUCKETS_MS
from pin_orchestration.news.reconcile import RECONCILE_JOB, read_backlog
from pin_orchestration.news.snapshot_detach.monitoring import SnapshotDetachCollector

# Counters and histograms over pin.job_runs add what runs deleted by pin-retention had
# contributed (pin.retired_totals, per job and status), so they never go down.
_RECONCILE_TOTALS = text(
    """
    WITH live AS (
        SELECT
            count(*) FILTER (WHERE status = 'failed') AS errors,
            coalesce(sum((result->>'duration_ms')::bigint)
                     FILTER (WHERE status <> 'skipped'), 0) AS duration_sum,
            count(*) FILTER (WHERE status <> 'skipped') AS runs
        FROM pin.job_runs WHERE job_code = :job_code
    ),
    retired AS (
        SELECT
            coalesce(sum(value) FILTER (WHERE name = 'runs' AND label = 'failed'), 0) AS errors,
            coalesce(sum(value) FILTER (WHERE name = 'duration_ms' AND label <> 'skipped'), 0)
                AS duration_sum,
            coalesce(sum(value) FILTER (WHERE name = 'runs' AND label <> 'skipped'), 0) AS runs
        FROM pin.retired_totals,
             LATERAL (SELECT substr(counter, length('job_runs/' || :job_code || '/') + 1))
                 AS n (name)
        WHERE starts_with(counter, 'job_runs/' || :job_code || '/')
    )
    SELECT live.errors + retired.errors AS errors,
           live.duration_sum + retired.duration_sum AS duration_sum,
           live.runs + retired.runs AS runs
    FROM live, retired
    """
)
_RUN_DURATION_BUCKETS = text(
    """
    SELECT b.le,
           count(r.id) + coalesce((
               SELECT t.value FROM pin.retired_totals AS t
               WHERE t.counter = 'job_runs/' || :job_code || '/duration_ms_le'
                 AND t.label = CAST(CAST(b.le AS double precision) AS text)), 0) AS runs
    FROM unnest(CAST(:buckets AS bigint[])) AS b(le)
    LEFT JOIN pin.job_runs AS r
        ON r.job_code = :job_code AND r.status <> 'skipped'
       AND (r.result->>'duration_ms')::bigint <= b.le
    GROUP BY b.le ORDER BY b.le
    """
)
# Posts reconciled and drift corrected, from each run's record (news.comment_reconcile_runs):
# each batch adds to it as it commits, so a cancelled, failed or crashed run's work counts,
# the same totals the analysts read; pin-retention never deletes it.
_RECONCILE_WORK = text(
    """
    SELECT coalesce(sum(posts_reconciled), 0) AS posts_reconciled,
           coalesce(sum(drift_corrected), 0) AS drift_corrected
    FROM news.comment_reconcile_runs
    """
)


def run_duration_histogram(
    engine: Engine, name: str, documentation: str, job_code: str
) -> HistogramMetricFamily:
    """A histogram of pin.job_runs durations (ms) of one job, cumulative as Prometheus wants."""
    with engine.connect() as conn:
        buckets = conn.execute(
            _RUN_DURATION_BUCKETS,
            {"buckets": list(RUN_DURATION_BUCKETS_MS), "job_code": job_code},
        ).all()
        totals = conn.execute(_RECONCILE_TOTALS, {"job_code": job_code}).one()
    family = HistogramMetricFamily(name, documentation)
    family.add_metric(
        [],
        [(str(le), runs) for le, runs in buckets] + [("+Inf", totals.runs)],
        sum_value=totals.duration_sum,
    )
    return family


class ReconcileCollector(Collector):
    """news_comment_reconcile_* (seed 000, REC-9)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        with self.engine.connect() as conn:
            totals = conn.execute(_RECONCILE_TOTALS, {"job_code": RECONCILE_JOB.code}).one()
            work = conn.execute(_RECONCILE_WORK).one()
        backlog = read_backlog(self.engine)
        yield CounterMetricFamily(
            "news_comment_reconcile_posts_reconciled",
            "Posts compared with their Visible comment count",
            value=work.posts_reconciled,
        )
        yield CounterMetricFamily(
            "news_comment_reconcile_drift_corrected",
            "Posts whose comments_count was wrong and was corrected",
            value=work.drift_corrected,
        )
        yield CounterMetricFamily(
            "news_comment_reconcile_errors", "Reconcile runs that failed", value=totals.errors
        )
        yield GaugeMetricFamily(
            "news_comment_reconcile_backlog_remaining",
            "1 while anything is owed: posts (news_comment_reconcile_owed_posts) or a pass "
            "not finished (cut by max_run_duration_seconds, stopped, failed, crashed)",
            value=1 if backlog.remaining else 0,
        )
        yield GaugeMetricFamily(
            "news_comment_reconcile_owed_posts",
            "Posts owed a reconcile: skipped by a batch (a hot-path writer held or changed "
            "the row) or in the window of a run skipped on the held lock",
            value=backlog.owed_posts,
        )
        yield run_duration_histogram(
            self.engine,
            "news_comment_reconcile_run_duration_ms",
            "Duration of reconcile runs in milliseconds",
            RECONCILE_JOB.code,
        )


def collectors(engine: Engine) -> Iterable[Collector]:
    from pin_orchestration.chessboard.metrics import ChessboardRecalcCollector
    from pin_orchestration.scraping.metrics import ScrapingCollector

    return [
        ReconcileCollector(engine),
        SnapshotDetachCollector(engine),
        ChessboardRecalcCollector(engine),
        ScrapingCollector(engine),
    ]


def build_registry(engine: Engine) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors(engine):
        registry.register(collector)
    return registry


def serve_metrics(engine: Engine, host: str, port: int) -> WSGIServer:
    """Start the /metrics endpoint in a background thread; returns the server to shut down."""
    server, _thread = start_http_server(port, addr=host, registry=build_registry(engine))
    return server
