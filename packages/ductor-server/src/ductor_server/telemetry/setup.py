"""Installing the OpenTelemetry SDK's providers from the standard `OTEL_*`
variables, when the `otel` extra is installed and telemetry is asked for.

Asked for means: `DUCTOR_OTEL` is on, or (with `DUCTOR_OTEL` unset) one of
`OTEL_TRACES_EXPORTER`, `OTEL_METRICS_EXPORTER`, `OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`
is set; `OTEL_SDK_DISABLED=true` or `DUCTOR_OTEL=off` turns it off. Everything
else (endpoint, headers, timeouts, sampler, batch sizes, export interval,
resource attributes, propagators) the SDK and its exporters read from their own
`OTEL_*` variables. A provider somebody else already set (an
`opentelemetry-instrument` wrapper, an embedding application) is kept.
Only the CLI's `serve` and `dev` call this; the server's code never needs it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace

from ductor_server.telemetry.instruments import metrics_enabled

log = logging.getLogger("ductor.telemetry")

TRIGGERS = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_METRICS_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)
"""The variables whose presence asks for telemetry when `DUCTOR_OTEL` is unset."""

EXPORTERS = ("otlp", "console", "none")
"""The exporter names `OTEL_TRACES_EXPORTER` and `OTEL_METRICS_EXPORTER` may hold."""

DEFAULT_SERVICE_NAME = "ductor"
"""`service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` names one."""


@dataclass(frozen=True)
class TelemetrySetup:
    """What `setup_from_env` installed.

    Attributes:
        traces: the span exporter ("otlp", "console"), "none", or "kept" when a
            tracer provider was already set.
        metrics: the same for metrics.
        service_name: the `service.name` of the resource.
    """

    traces: str
    metrics: str
    service_name: str


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether `environ` asks for telemetry (see the module docstring).

    Raises:
        ValueError: `DUCTOR_OTEL` is neither on nor off.
    """
    switch = environ.get("DUCTOR_OTEL", "").strip()
    value = switch.lower()
    # The switch is checked first: a bad value is refused whatever else is set.
    if switch and value not in {"on", "true", "1", "yes", "off", "false", "0", "no"}:
        raise ValueError(f"DUCTOR_OTEL must be on or off, got {switch!r}")
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if switch:
        return value in {"on", "true", "1", "yes"}
    return any(environ.get(name, "").strip() for name in TRIGGERS)


def _exporter_name(environ: Mapping[str, str], variable: str) -> str:
    names = [n.strip().lower() for n in environ.get(variable, "otlp").split(",") if n.strip()]
    if not names:
        return "otlp"
    for name in names:
        if name not in EXPORTERS:
            raise ValueError(
                f"{variable}={environ[variable]!r}: Ductor sets up "
                f"{', '.join(EXPORTERS)}; for others, run under opentelemetry-instrument"
            )
    if len(names) > 1:
        raise ValueError(f"{variable}: name one exporter, not {len(names)}")
    return names[0]


def _protocol(environ: Mapping[str, str], signal: str) -> str:
    value = (
        environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if value not in {"http/protobuf", "grpc"}:
        raise ValueError(
            f"OTLP protocol {value!r} is not supported: use http/protobuf (the default) or grpc"
        )
    return value


def _otlp_span_exporter(environ: Mapping[str, str]) -> Any:
    if _protocol(environ, "TRACES") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError:
            raise ValueError(
                "OTLP over grpc needs opentelemetry-exporter-otlp-proto-grpc installed"
            ) from None
        return OTLPSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _otlp_metric_exporter(environ: Mapping[str, str]) -> Any:
    if _protocol(environ, "METRICS") == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # type: ignore[import-not-found,unused-ignore]
                OTLPMetricExporter,
            )
        except ImportError:
            raise ValueError(
                "OTLP over grpc needs opentelemetry-exporter-otlp-proto-grpc installed"
            ) from None
        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    return OTLPMetricExporter()


def setup_from_env(environ: Mapping[str, str] | None = None) -> TelemetrySetup | None:
    """Install the SDK's tracer and meter providers as `environ` (the process
    environment if None) asks; None when telemetry is not asked for or the SDK
    is not installed (a warning names the extra then). `environ` decides whether,
    which exporters and the service name; the SDK and its exporters read their
    other settings from the process environment.

    Raises:
        ValueError: a setting Ductor cannot honour (an unknown exporter or
            protocol, a missing grpc exporter, a bad `DUCTOR_OTEL`).
    """
    environ = os.environ if environ is None else environ
    if not wanted(environ):
        return None
    try:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            ConsoleMetricExporter,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError:
        log.warning(
            "OpenTelemetry is configured (OTEL_* or DUCTOR_OTEL) but its SDK is not"
            " installed: install ductor-server[otel]; telemetry stays off"
        )
        return None
    traces = _exporter_name(environ, "OTEL_TRACES_EXPORTER")
    metric_exporter = _exporter_name(environ, "OTEL_METRICS_EXPORTER")
    if traces == "otlp":
        _protocol(environ, "TRACES")
    if metric_exporter == "otlp":
        _protocol(environ, "METRICS")
    named = environ.get("OTEL_SERVICE_NAME", "").strip()
    resource = Resource.create({SERVICE_NAME: named} if named else None)
    service = str(resource.attributes.get(SERVICE_NAME, ""))
    if not service or service.startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
        service = DEFAULT_SERVICE_NAME

    # Every exporter is made before any provider is set, so a bad setting changes nothing.
    span_exporter: Any = None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        traces = "kept"
    elif traces != "none":
        span_exporter = _otlp_span_exporter(environ) if traces == "otlp" else ConsoleSpanExporter()
    metric_reader: Any = None
    if metrics_enabled():
        metric_exporter = "kept"
    elif metric_exporter != "none":
        metric_reader = PeriodicExportingMetricReader(
            _otlp_metric_exporter(environ) if metric_exporter == "otlp" else ConsoleMetricExporter()
        )
    if span_exporter is not None:
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        trace.set_tracer_provider(tracer_provider)
    if metric_reader is not None:
        metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=[metric_reader]))
    return TelemetrySetup(traces=traces, metrics=metric_exporter, service_name=service)


__all__ = [
    "DEFAULT_SERVICE_NAME",
    "EXPORTERS",
    "TRIGGERS",
    "TelemetrySetup",
    "setup_from_env",
    "wanted",
]
