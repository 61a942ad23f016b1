"""OpenTelemetry for the server: the tracer, the instruments, and the trace
context stored with runs and tasks (see docs/observability.md).

Everything here speaks only `opentelemetry-api`: with no SDK installed and set
up, spans are non-recording, instruments are no-ops, and a run or task stores
no trace context unless a caller sent one. `ductor_server.telemetry.setup`
installs the SDK's providers from the `OTEL_*` variables (the `otel` extra).
This package imports nothing else of the server, so every layer may use it.
"""

from __future__ import annotations

from ductor_server.telemetry.context import (
    MAX_TRACESTATE,
    client_span,
    context_from,
    current_trace_context,
    current_traceparent,
    has_client_span,
    inject_headers,
    wants_spans,
)
from ductor_server.telemetry.instruments import (
    API_DURATION,
    ATTEMPT_DURATION,
    DURATION_BUCKETS,
    QUEUE_DEPTH,
    ROUTE_DURATION,
    TASK_WAIT,
    TICK_DURATION,
    attempt_outcome,
    meter,
    metrics_enabled,
    tracer,
    tracing_enabled,
)
from ductor_server.telemetry.spans import traced

__all__ = [
    "API_DURATION",
    "ATTEMPT_DURATION",
    "DURATION_BUCKETS",
    "MAX_TRACESTATE",
    "QUEUE_DEPTH",
    "ROUTE_DURATION",
    "TASK_WAIT",
    "TICK_DURATION",
    "attempt_outcome",
    "client_span",
    "context_from",
    "current_trace_context",
    "current_traceparent",
    "has_client_span",
    "inject_headers",
    "meter",
    "metrics_enabled",
    "traced",
    "tracer",
    "tracing_enabled",
    "wants_spans",
]
