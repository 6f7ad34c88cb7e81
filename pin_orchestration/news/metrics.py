"""news_comment_reconcile_* for Prometheus (seed 000, REC-9), read at scrape time from the
runs' records and the backlog."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine

from pin_orchestration.coordination.run_metrics import job_run_totals, run_duration_histogram
from pin_orchestration.news.reconcile import RECONCILE_JOB, read_backlog
from pin_orchestration.platform.sql import NamedQueries

_q = NamedQueries("pin_orchestration.news", "reconcile.sql")


class ReconcileCollector(Collector):
    """news_comment_reconcile_* (seed 000, REC-9)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        with self.engine.connect() as conn:
            totals = job_run_totals(conn, RECONCILE_JOB.code)
            work = conn.execute(_q("reconcile_work")).one()
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
