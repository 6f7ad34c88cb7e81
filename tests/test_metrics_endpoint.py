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
        server.wait(timeout=30)
    # Sample names carry the type's suffixes (_total, _bucket, ...): compare families too.
    names = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    missing = sorted(SEED_METRICS - names)
    assert missing == [], f"not exposed: {missing}"
