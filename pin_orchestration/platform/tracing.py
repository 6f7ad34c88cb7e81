"""OpenTelemetry traces of the jobs (the seeds' "Traces" rows), off by default.

The standard variables choose the exporter, read when the first span starts (never at
import): OTEL_TRACES_EXPORTER is `none` (the default here, unlike the SDK's `otlp`),
`otlp` (OTLP over HTTP/protobuf to OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, default http://localhost:4318) or `console` (JSON on
stderr: stdout is the CLI's summary), comma-separated for several; OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES name the service (pin-orchestration by default). A tracer
provider installed by the host process (an agent, a test's in-memory exporter) is kept.

Spans open at the run, batch, attempt and project level through `traced` and `span`; the
selections call carries the current context in its headers (`trace_headers`), so the
callee's spans join the attempt's trace.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

TRACER_NAME = "pin_orchestration"
DEFAULT_SERVICE_NAME = "pin-orchestration"
EXPORTERS = ("none", "otlp", "console")
OTLP_PROTOCOL = "http/protobuf"

Attributes = Mapping[str, AttributeValue]
P = ParamSpec("P")
R = TypeVar("R")

_configure_lock = threading.Lock()
_configured = False


class TracingConfigError(ValueError):
    """An OTEL_* variable holds a value this project cannot use."""


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER names (none when unset), validated."""
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    names = [name.strip() for name in raw.split(",") if name.strip()] or ["none"]
    unknown = [name for name in names if name not in EXPORTERS]
    if unknown:
        raise TracingConfigError(
            f"OTEL_TRACES_EXPORTER must be one of {', '.join(EXPORTERS)} or a comma-separated "
            f"list of them (got {raw!r}); unset it to turn traces off"
        )
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or OTLP_PROTOCOL
    )
    if "otlp" in names and protocol != OTLP_PROTOCOL:
        raise TracingConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL must be {OTLP_PROTOCOL} (got {protocol!r}): the "
            "traces go over OTLP/HTTP (a collector's port 4318); unset it for the default"
        )
    return [name for name in names if name != "none"]


def configure_from_env(environ: Mapping[str, str] | None = None) -> None:
    """Install the exporters the OTEL_* variables name, once per process."""
    global _configured
    if _configured:
        return
    with _configure_lock:
        if _configured:
            return
        names = exporter_names(os.environ if environ is None else environ)
        _configured = True
        if not names or not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            return
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SimpleSpanProcessor,
        )

        # Resource.create reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; without a
        # name from them the SDK says unknown_service.
        resource = Resource.create()
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
        provider = TracerProvider(resource=resource)
        if "otlp" in names:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            # Batched: a span costs the job no network round trip. Flushed at exit (the
            # provider's atexit shutdown), so a CLI run's spans are not lost.
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        if "console" in names:
            provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
        trace.set_tracer_provider(provider)


def enabled() -> bool:
    """Whether spans are recorded: an exporter was configured, or the host installed a
    tracer provider. When not, spans cost nothing (a detach call is ~1 ms; a no-op span
    with its context switch would add a tenth)."""
    configure_from_env()
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def current_context() -> otel_context.Context:
    """The active context, to parent spans opened on another thread (a call pool's)."""
    return otel_context.get_current()


@contextmanager
def span(
    name: str, attributes: Attributes | None = None, *, parent: otel_context.Context | None = None
) -> Iterator[trace.Span]:
    """A span, current while the block runs; an exception marks it failed."""
    if not enabled():
        yield trace.INVALID_SPAN
        return
    tracer = trace.get_tracer(TRACER_NAME)
    with tracer.start_as_current_span(name, context=parent, attributes=attributes) as current:
        yield current


def traced(
    name: str,
    attributes: Callable[[Mapping[str, Any]], Attributes] | None = None,
    result_attributes: Callable[[Any], Attributes] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the decorated function in a span `name`: `attributes` gets its arguments by
    name (defaults applied), `result_attributes` what it returned."""

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            if not enabled():
                return function(*args, **kwargs)
            opening = None
            if attributes is not None:
                bound = signature.bind(*args, **kwargs)
                bound.apply_defaults()
                opening = attributes(bound.arguments)
            with span(name, opening) as current:
                result = function(*args, **kwargs)
                if result_attributes is not None and current.is_recording():
                    current.set_attributes(result_attributes(result))
                return result

        return run

    return decorate


def trace_headers() -> dict[str, str]:
    """The W3C trace context (traceparent) of the current span, for an outgoing call."""
    headers: dict[str, str] = {}
    if enabled():
        from opentelemetry.propagate import inject

        inject(headers)
    return headers
