"""Optional OpenTelemetry: the app's side of the engine's traces.

When `opentelemetry-api` is installed (any app that sets up the OpenTelemetry
SDK has it; `pip install ductor[otel]` adds it), an execute or cancel request
is a span that continues the engine's trace, a step run in process is a span
inside it, and calls to the server carry the current trace context. Without
it every function here does nothing, at no cost.

The parent of the request's span is the current span when the app's framework
is instrumented (it already continued the request's `traceparent`); otherwise
the request's `traceparent` header, else the `traceparent` in its signed body.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

try:
    from opentelemetry import propagate, trace
    from opentelemetry.trace import SpanKind, StatusCode
except ImportError:  # the SDK runs without OpenTelemetry
    _tracer: Any = None
else:
    _tracer = trace.get_tracer("ductor-sdk")

_PROPAGATED = ("traceparent", "tracestate", "baggage")


def enabled() -> bool:
    """Whether `opentelemetry-api` is installed."""
    return _tracer is not None


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current trace context to the headers of a call to the server."""
    if _tracer is not None:
        propagate.inject(headers)


def _parent(headers: Mapping[str, str], traceparent: str | None) -> tuple[Any, Any]:
    """(context, span kind) of a request's span."""
    current = trace.get_current_span().get_span_context()
    if current.is_valid and not current.is_remote:
        return None, SpanKind.INTERNAL  # an instrumented framework's server span
    carrier = {}
    for name in _PROPAGATED:
        value = headers.get(name)
        if value is None:
            value = next((v for k, v in headers.items() if k.lower() == name), None)
        if value is not None:
            carrier[name] = value
    if "traceparent" not in carrier and traceparent:
        carrier["traceparent"] = traceparent
    return propagate.extract(carrier), SpanKind.SERVER


@contextmanager
def request_span(
    action: str,
    headers: Mapping[str, str],
    *,
    traceparent: str | None,
    attributes: Mapping[str, str | int],
) -> Iterator[None]:
    """The span of one `execute` or `cancel` request (`ductor.execute`, `ductor.cancel`)."""
    if _tracer is None:
        yield
        return
    context, kind = _parent(headers, traceparent)
    with _tracer.start_as_current_span(
        f"ductor.{action}", context=context, kind=kind, attributes=dict(attributes)
    ):
        yield


@contextmanager
def step_span(name: str, *, attempt: int) -> Iterator[Any]:
    """The span of one step run in process (`ductor.step`); yields it (or None).
    `attempt` counts the step's failed tries so far; the span's `ductor.attempt`
    is the try this is, 1 for the first, as on the engine's spans."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(
        "ductor.step", attributes={"ductor.step": name, "ductor.attempt": attempt + 1}
    ) as span:
        yield span


def failed(span: Any, code: str) -> None:
    """Mark a step's span as failed with the step's error code."""
    if span is not None:
        span.set_attribute("ductor.error_code", code)
        span.set_status(StatusCode.ERROR, code)


__all__ = ["enabled", "failed", "inject", "request_span", "step_span"]
