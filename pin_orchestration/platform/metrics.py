"""Prometheus exposition of the seeds' metrics (`pin metrics serve`).

Job runs are short-lived processes, so every figure is read from durable state in
PostgreSQL at scrape time by custom collectors — nothing lives in process memory. Each
area writes its collector beside its code (a job's run figures: coordination/run_metrics.py);
the wiring hands them in (pin_orchestration/areas.py lists them): this module imports no area.
"""

from __future__ import annotations

from collections.abc import Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.registry import Collector


def build_registry(collectors: Iterable[Collector]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def serve_metrics(collectors: Iterable[Collector], host: str, port: int) -> WSGIServer:
    """Start the /metrics endpoint in a background thread; returns the server to shut down."""
    server, _thread = start_http_server(port, addr=host, registry=build_registry(collectors))
    return server
