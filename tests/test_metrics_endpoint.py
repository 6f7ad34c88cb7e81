"""`pin metrics serve`: one Prometheus endpoint with every metric the seeds name, under the
seed's name, values read from PostgreSQL (so any process can serve them)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import requests
from prometheus_client.parser import text_string_to_metric_families

from pin_orchestration.devstack.processes import stuck_state

# The names exactly as seeds 000, 001 and 002 write them (the scraping service's, seed 004,
# are the scraping area's own).
SEED_METRICS = {
    # seed 000 news-comment-reconcile
    "news_comment_reconcile_posts_reconciled_total",
    "news_comment_reconcile_drift_corrected_total",
    "news_comment_reconcile_errors_total",
    "news_comment_reconcile_run_duration_ms",
    "news_comment_reconcile_backlog_remaining",
    # seed 001 news-snapshot-detach-retry
    "news_snapshot_detach_pending",
    "news_snapshot_detach_oldest_age_seconds",
    "news_snapshot_detach_retried_total",
    "news_snapshot_detach_succeeded_total",
    "news_snapshot_detach_failed_total",
    "news_snapshot_detach_quarantined_total",
    "news_snapshot_detach_lag_seconds",
    # seed 002 chessboard project-aggregates-recalc
    "chessboard_recalc_queue_depth",
    "chessboard_recalc_due_backlog",
    "chessboard_recalc_process_duration_seconds",
    "chessboard_recalc_runs_total",
    "chessboard_recalc_coalesced_events_total",
    "chessboard_recalc_republished_total",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return requests.get(url, timeout=5).text
        except requests.ConnectionError:
            assert time.monotonic() < deadline, "pin metrics serve never answered"
            time.sleep(0.2)


def test_metrics_serve_exposes_every_seed_metric(db_url: str) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "pin_orchestration.cli", "metrics", "serve", "--port", str(port)],
        env={**os.environ, "PIN_DATABASE_URL": db_url},
    )
    try:
        exposition = scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            state = stuck_state(server.pid)
            server.kill()
            raise AssertionError(f"pin metrics serve did not stop on SIGINT: {state}") from None
    # Sample names carry the type's suffixes (_total, _bucket, ...): compare families too.
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    missing = sorted(SEED_METRICS - names)
    assert missing == [], f"not exposed: {missing}"


def test_metric_values_follow_the_state_they_report(db_engine) -> None:
    """Not only the names: each figure is what the rows say."""
    import uuid

    from sqlalchemy import text

    from pin_orchestration.areas import metrics_registry
    from pin_orchestration.platform.ids import uuid7

    with db_engine.begin() as conn:
        # Reconcile runs: durations 50, 700 and 40,000 ms; a skipped run is no duration. A
        # FullSweep pass is unfinished and two posts are owed (the backlog gauges).
        conn.execute(
            text(
                "INSERT INTO pin.job_checkpoints (checkpoint_key, last_id) "
                "VALUES ('news-comment-reconcile:FullSweep', gen_random_uuid())"
            )
        )
        conn.execute(
            text(
                # Owed posts that still exist and are not Archived: the gauge counts only
                # what a next run would reconcile (a gone post is forgiven, not owed).
                "WITH posts AS (INSERT INTO news.posts (id, status) VALUES "
                "(gen_random_uuid(), 'Published'), (gen_random_uuid(), 'Draft') RETURNING id) "
                "INSERT INTO news.comment_reconcile_owed (post_id, reason) "
                "SELECT id, CASE WHEN row_number() OVER () = 1 THEN 'skipped' "
                "ELSE 'lock_held' END FROM posts"
            )
        )
        for n, (status, duration, backlog, minutes_ago) in enumerate(
            [
                ("succeeded", 50, False, 30),
                ("succeeded", 700, False, 20),
                ("succeeded", 40_000, True, 10),
                ("skipped", 5, False, 5),
            ]
        ):
            conn.execute(
                text(
                    """
                    INSERT INTO pin.job_runs (job_code, run_id, status, started_at, finished_at,
                                              result)
                    VALUES ('news-comment-reconcile', :run, :status,
                            now() - make_interval(mins => :ago),
                            now() - make_interval(mins => :ago),
                            jsonb_build_object('duration_ms', CAST(:ms AS bigint),
                                               'backlog_remaining', CAST(:backlog AS boolean)))
                    """
                ),
                {
                    "run": f"r{n}",
                    "status": status,
                    "ms": duration,
                    "backlog": backlog,
                    "ago": minutes_ago,
                },
            )
        # Recalc queue: two due, one not yet due, one poison (not backlog).
        for due_in, attempts in ((-60, 0), (-5, 1), (300, 0), (-600, 5)):
            conn.execute(
                text(
                    """
                    INSERT INTO chessboard.project_recalc_requests
                        (project_id, tenant_id, due_at, first_requested_at, last_reason,
                         attempt_count, created_at, updated_at)
                    VALUES (:p, :t, now() + make_interval(secs => :s), now(), 'test', :a,
                            now(), now())
                    """
                ),
                {"p": uuid.uuid4(), "t": uuid.uuid4(), "s": due_in, "a": attempts},
            )
        # Detach outbox: the oldest Pending entry is 600 s old; a Done one older still.
        for status, age in (("Pending", 600), ("Pending", 60), ("Done", 7200)):
            conn.execute(
                text(
                    """
                    INSERT INTO news.snapshot_detach_outbox
                        (id, snapshot_id, post_id, reason, status, created_at)
                    VALUES (:id, :snap, :post, 'PostDeleted', :status,
                            now() - make_interval(secs => :age))
                    """
                ),
                {
                    "id": uuid7(),
                    "snap": uuid.uuid4(),
                    "post": uuid7(),
                    "status": status,
                    "age": age,
                },
            )

    registry = metrics_registry(db_engine)
    value = registry.get_sample_value
    assert value("news_comment_reconcile_backlog_remaining") == 1
    assert value("news_comment_reconcile_owed_posts") == 2
    buckets = {
        le: value("news_comment_reconcile_run_duration_ms_bucket", {"le": le})
        for le in ("100", "500", "1000", "30000", "60000", "+Inf")
    }
    assert buckets == {
        "100": 1,
        "500": 1,
        "1000": 2,
        "30000": 2,
        "60000": 3,
        "+Inf": 3,
    }
    assert value("news_comment_reconcile_run_duration_ms_sum") == 40_750
    assert value("news_comment_reconcile_run_duration_ms_count") == 3
    assert value("chessboard_recalc_due_backlog") == 2
    oldest = value("news_snapshot_detach_oldest_age_seconds")
    assert 600 <= oldest < 900, oldest  # created 600 s before the scrape, Done left out
