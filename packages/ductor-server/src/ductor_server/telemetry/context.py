"""The W3C trace context a run or a task carries through the store.

A stored trace context is the `traceparent` of the span that created the row,
followed by one space and its `tracestate` when it has one (a `traceparent`
holds no space). It is written from the current span when the row is created
and read back as the parent of the spans that work on the row later, in any
process and after any restart. No current span (no SDK, no incoming
`traceparent`): nothing is stored, and nothing is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager

from opentelemetry import propagate, trace
from opentelemetry.context import Context, attach, create_key, detach, get_value, set_value
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from ductor_server.telemetry.instruments import tracer, tracing_enabled

MAX_TRACESTATE = 512
"""The longest `tracestate` stored with a row (characters); a longer one is
dropped, as W3C lets a participant do, so a caller cannot make every task of its
runs carry kilobytes."""

_W3C = TraceContextTextMapPropagator()
_OWN_CLIENT_SPAN = create_key("ductor-own-client-span")


def current_trace_context() -> str | None:
    """The current span's trace context in its stored form, or None when there is
    no valid current span."""
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _W3C.inject(carrier)
    parent = carrier.get("traceparent")
    if parent is None:
        return None
    state = carrier.get("tracestate")
    if state and len(state) <= MAX_TRACESTATE:
        return f"{parent} {state}"
    return parent


def current_traceparent() -> str | None:
    """The current span's W3C `traceparent`, or None when there is no valid current span."""
    stored = current_trace_context()
    return None if stored is None else stored.partition(" ")[0]


def wants_spans(stored: str | None) -> bool:
    """Whether work that continues the `stored` trace context should make spans of
    its own: there is a trace to continue, or a tracer provider records them.
    Otherwise a span would be non-recording and change nothing current."""
    return stored is not None or tracing_enabled()


def context_from(stored: str | None) -> Context | None:
    """The OpenTelemetry context whose (remote) parent is the stored trace context,
    or None when nothing (or nothing valid) is stored."""
    if not stored:
        return None
    parent, _, state = stored.partition(" ")
    carrier = {"traceparent": parent}
    if state:
        carrier["tracestate"] = state
    context = _W3C.extract(carrier)
    if not trace.get_current_span(context).get_span_context().is_valid:
        return None
    return context


def inject_headers(headers: MutableMapping[str, str]) -> None:
    """Add the current trace context (`traceparent`, `tracestate`, ... as the
    configured propagators write them) to outgoing HTTP headers."""
    propagate.inject(headers)


@contextmanager
def client_span(name: str, attributes: Mapping[str, AttributeValue]) -> Iterator[Span]:
    """A CLIENT span around one outbound call by a caller that knows what the call
    is (a bridge call to an app): the guarded transport then sends this span's
    context and makes no HTTP span of its own (`has_client_span`)."""
    with tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes) as span:
        token = attach(set_value(_OWN_CLIENT_SPAN, True))
        try:
            yield span
        finally:
            detach(token)


def has_client_span() -> bool:
    """Whether the current call is already inside a `client_span`."""
    return bool(get_value(_OWN_CLIENT_SPAN))


__all__ = [
    "MAX_TRACESTATE",
    "client_span",
    "context_from",
    "current_trace_context",
    "current_traceparent",
    "has_client_span",
    "inject_headers",
    "wants_spans",
]
