"""The seeds' traces: a span per run and per batch (reconcile), per attempt with the trace
context in the selections call (detach), per tick and per project (chessboard); the
OTEL_* variables choose the exporter, and nothing is exported by default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pytest_httpserver import HTTPServer
from sqlalchemy import Engine
from werkzeug import Request, Response

from pin_orchestration.chessboard.drain import drain_tick
from pin_orchestration.news.reconcile import ReconcileOptions, Scope, run_reconcile
from pin_orchestration.news.selections import SelectionsClient
from pin_orchestration.news.snapshot_detach.outbox import enqueue_snapshot_detach
from pin_orchestration.news.snapshot_detach.policy import DetachOptions, Reason
from pin_orchestration.news.snapshot_detach.worker import run_detach_retry
from pin_orchestration.platform.tracing import TracingConfigError, exporter_names
from tests.chessboard.world import T0, add_project, enqueue
from tests.news_reconcile.factories import add_post

PIN = [sys.executable, "-m", "pin_orchestration.cli"]


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans this test ends, kept in memory (the SDK's exporter)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # later tests' spans are dropped, not kept


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def children_of(parent: ReadableSpan, spans: list[ReadableSpan]) -> bool:
    return all(
        s.parent is not None
        and s.parent.span_id == parent.context.span_id
        and s.context.trace_id == parent.context.trace_id
        for s in spans
    )


def test_reconcile_has_a_span_per_run_with_a_child_per_round_of_batches(
    db_engine: Engine, spans: InMemorySpanExporter
) -> None:
    for _ in range(5):
        add_post(db_engine, comments_count=1)
    result = run_reconcile(
        db_engine,
        ReconcileOptions(scope=Scope.FULL_SWEEP, batch_size=2),
        run_id="run-42",
        holder="test",
    )
    [run] = named(spans, "news-comment-reconcile")
    assert dict(run.attributes) == {
        "jobRunId": "run-42",
        "scope": "FullSweep",
        "batchSize": 2,
        "status": "succeeded",
        "postsReconciled": 5,
        "driftCorrected": 5,
        "batchesProcessed": result.batches_processed,
        "backlogRemaining": False,
    }
    rounds = named(spans, "news-comment-reconcile.batches")
    assert rounds and children_of(run, rounds)
    assert sum(s.attributes["batches"] for s in rounds) == result.batches_processed
    assert sum(s.attributes["corrected"] for s in rounds) == 5


def test_detach_has_a_span_per_attempt_whose_context_the_selections_call_carries(
    db_engine: Engine, spans: InMemorySpanExporter
) -> None:
    snapshots = [uuid.uuid4(), uuid.uuid4()]
    with db_engine.begin() as conn:
        for snapshot in snapshots:
            enqueue_snapshot_detach(conn, snapshot, uuid.uuid4(), Reason.BLOCK_REPLACED)
    traceparents: dict[str, str] = {}

    def answer(request: Request) -> Response:
        traceparents[request.path.split("/")[3]] = request.headers.get("traceparent", "")
        return Response("{}", 200 if request.path.split("/")[3] == str(snapshots[0]) else 503)

    with HTTPServer(host="127.0.0.1", port=0, threaded=True) as server:
        server.expect_request(
            f"/internal/snapshots/{snapshots[0]}/detach", method="POST"
        ).respond_with_handler(answer)
        server.expect_request(
            f"/internal/snapshots/{snapshots[1]}/detach", method="POST"
        ).respond_with_handler(answer)
        with SelectionsClient(server.url_for("/").rstrip("/"), "token") as client:
            run_detach_retry(db_engine, client, DetachOptions(), run_id="run-7", holder="test")

    [run] = named(spans, "news-snapshot-detach-retry")
    assert run.attributes["jobRunId"] == "run-7"
    assert (run.attributes["succeeded"], run.attributes["retried"]) == (1, 1)
    attempts = named(spans, "news-snapshot-detach-retry.attempt")
    assert children_of(run, attempts)
    by_snapshot = {s.attributes["snapshotId"]: s for s in attempts}
    assert set(by_snapshot) == {str(s) for s in snapshots}
    assert {s.attributes["attempts"] for s in attempts} == {1}
    assert by_snapshot[str(snapshots[0])].attributes["outcome"] == "http_200"
    assert by_snapshot[str(snapshots[1])].attributes["outcome"] == "http_503"
    # W3C traceparent: 00-<trace id>-<parent span id>-<flags>; the parent is the attempt.
    for snapshot, attempt in by_snapshot.items():
        version, trace_id, parent_id, _ = traceparents[snapshot].split("-")
        assert version == "00"
        assert int(trace_id, 16) == attempt.context.trace_id
        assert int(parent_id, 16) == attempt.context.span_id


def test_chessboard_has_a_span_per_tick_and_per_project(
    db_engine: Engine, spans: InMemorySpanExporter
) -> None:
    with db_engine.begin() as conn:
        projects = [add_project(conn), add_project(conn)]
    for project in projects:
        enqueue(db_engine, project, reason="Crud")
    drain_tick(db_engine, now=T0 + timedelta(minutes=1))
    [tick] = named(spans, "project-aggregates-recalc.tick")
    uuid.UUID(tick.attributes["correlationId"])
    assert tick.attributes["projects"] == 2
    per_project = named(spans, "project-aggregates-recalc.project")
    claimed = [s for s in per_project if s.attributes.get("claimed") is not False]
    assert children_of(tick, per_project)
    assert {s.attributes["ProjectId"] for s in claimed} == {str(p) for p in projects}
    with db_engine.connect() as conn:
        tenants = {
            str(t)
            for t in conn.exec_driver_sql("SELECT tenant_id FROM chessboard.projects").scalars()
        }
    assert {s.attributes["TenantId"] for s in claimed} == tenants
    assert {s.attributes["LastReason"] for s in claimed} == {"Crud"}
    assert {s.attributes["result"] for s in claimed} == {"recalculated"}


# --- the OTEL_* variables, as an operator sets them on `pin` ------------------------------------


def pin_reconcile(db_url: str, **otel: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.run(
        [*PIN, "news", "reconcile", "--scope", "FullSweep"],
        env={**env, "PIN_DATABASE_URL": db_url, **otel},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_otlp_exports_the_run_to_the_configured_endpoint(db_url: str, db_engine: Engine) -> None:
    add_post(db_engine, comments_count=1)
    received: list[ExportTraceServiceRequest] = []

    def collect(request: Request) -> Response:
        received.append(ExportTraceServiceRequest.FromString(request.data))
        return Response(b"", 200, mimetype="application/x-protobuf")

    with HTTPServer(host="127.0.0.1", port=0) as collector:
        collector.expect_request("/v1/traces", method="POST").respond_with_handler(collect)
        run = pin_reconcile(
            db_url,
            OTEL_TRACES_EXPORTER="otlp",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.url_for("/").rstrip("/"),
            OTEL_SERVICE_NAME="pin-test",
        )
    assert run.returncode == 0, run.stderr
    exported = [
        (resource, span)
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    names = {span.name for _, span in exported}
    assert {"news-comment-reconcile", "news-comment-reconcile.batches"} <= names
    services = {
        attribute.value.string_value
        for resource, _ in exported
        for attribute in resource.resource.attributes
        if attribute.key == "service.name"
    }
    assert services == {"pin-test"}
    [root] = [span for _, span in exported if span.name == "news-comment-reconcile"]
    attributes = {a.key: a.value for a in root.attributes}
    assert attributes["jobRunId"].string_value.startswith("cli-")  # the CLI's run id
    assert attributes["scope"].string_value == "FullSweep"


def test_console_writes_spans_to_stderr_and_keeps_stdout_the_summary(db_url: str) -> None:
    run = pin_reconcile(db_url, OTEL_TRACES_EXPORTER="console")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["status"] == "succeeded"
    assert '"name": "news-comment-reconcile"' in run.stderr


def test_traces_are_off_by_default(db_url: str, tmp_path: Path) -> None:
    with HTTPServer(host="127.0.0.1", port=0) as collector:
        collector.expect_request("/v1/traces", method="POST").respond_with_data("")
        # An endpoint alone does not turn traces on.
        run = pin_reconcile(db_url, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url_for("/"))
        assert run.returncode == 0, run.stderr
        assert collector.log == []
    assert '"name"' not in run.stderr


def test_a_bad_exporter_is_refused_naming_the_variable(db_url: str) -> None:
    run = pin_reconcile(db_url, OTEL_TRACES_EXPORTER="jaeger")
    assert run.returncode != 0
    assert "OTEL_TRACES_EXPORTER must be one of none, otlp, console" in run.stderr


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "OTLP, console"}, ["otlp", "console"]),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            ["otlp"],
        ),
    ],
)
def test_exporter_names(environ: dict[str, str], expected: list[str]) -> None:
    assert exporter_names(environ) == expected


def test_a_grpc_protocol_is_refused_naming_the_variable() -> None:
    with pytest.raises(TracingConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL must be"):
        exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
