"""Prometheus exposition of the seeds' metrics (`pin metrics serve`).

Job runs are short-lived processes, so every figure is read from durable state in
PostgreSQL at scrape time by custom collectors — nothing lives in process memory. Each
area writes its collector beside its code; the wiring hands them in
(pin_orchestration/areas.py lists them): this module imports no area.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Connection, Engine, Row, text

from pin_orchestration.coordination.jobruns import RUN_DURATION_BUCKETS_MS
from pin_orchestration.platform.sql import load_queries


def _query(name: str) -> Any:
    return text(load_queries("pin_orchestration.platform", "metrics.sql")[name])


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


def build_registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def serve_metrics(collectors: Iterable[Collector], host: str, port: int) -> WSGIServer:
    """Start the /metrics endpoint in a background thread; returns the server to shut down."""
    server, _thread = start_http_server(port, addr=host, registry=build_registry(collectors))
    return server
