"""The figures of one job's runs (pin.job_runs) that an area's Prometheus collector exposes:
its totals and its run-duration histogram, with what pin-retention retired from them."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import HistogramMetricFamily
from sqlalchemy import Connection, Engine, Row

from pin_orchestration.coordination.jobruns import RUN_DURATION_BUCKETS_MS
from pin_orchestration.platform.sql import NamedQueries

_query = NamedQueries("pin_orchestration.coordination", "run_metrics.sql")


def job_run_totals(conn: Connection, job_code: str) -> Row[Any]:
    """errors, duration_sum (ms) and runs of one job, retired runs included."""
    return conn.execute(_query("job_run_totals"), {"job_code": job_code}).one()


def run_duration_histogram(
    engine: Engine, name: str, documentation: str, job_code: str
) -> HistogramMetricFamily:
    """A histogram of pin.job_runs durations (ms) of one job, cumulative as Prometheus wants."""
    with engine.connect() as conn:
        buckets = conn.execute(
            _query("run_duration_buckets"),
            {"buckets": list(RUN_DURATION_BUCKETS_MS), "job_code": job_code},
        ).all()
        totals = job_run_totals(conn, job_code)
    family = HistogramMetricFamily(name, documentation)
    family.add_metric(
        [],
        [(str(le), runs) for le, runs in buckets] + [("+Inf", totals.runs)],
        sum_value=totals.duration_sum,
    )
    return family
