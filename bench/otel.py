"""Benchmark: what the OpenTelemetry instrumentation costs a step, with no SDK
set up (the default) and with the SDK recording every span and metric.

Run: uv run python bench/otel.py [--steps N] [--repeat R]

Per step the engine does what this loop does: it starts a `ductor.tick` span
from the trace context stored with the run and makes it current while writing
the next task (`current_trace_context`), then a worker starts the task's
`ductor.task` span from the task's stored context and its `ductor.attempt`
span, and records the attempt's and the task wait's histograms. The baseline,
measured in the same run, is msgspec JSON encode + decode of a small task
payload, far below what a step costs in the store (one commit is ~1 ms).
Times are CPU seconds of this process, the median of several repeats. The
no-SDK rows are measured before the SDK's providers are set (they can be set
once per process).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import msgspec
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind

from ductor_server.telemetry import (
    ATTEMPT_DURATION,
    TASK_WAIT,
    context_from,
    current_trace_context,
    tracer,
)

STORED = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
PAYLOAD = {"action": "http", "params": {"url": "https://example.com/hook", "body": {"n": 1}}}


def step(stored: str | None) -> str | None:
    tick = tracer.start_span("ductor.tick", context=context_from(stored))
    with trace.use_span(tick, end_on_exit=True):
        queued = current_trace_context()
    with (
        tracer.start_as_current_span(
            "ductor.task", context=context_from(queued), kind=SpanKind.CONSUMER
        ),
        tracer.start_as_current_span("ductor.attempt") as attempt,
    ):
        attempt.set_attribute("ductor.outcome", "ok")
        ATTEMPT_DURATION.record(0.001, {"ductor.handler": "bridge", "ductor.outcome": "ok"})
        TASK_WAIT.record(0.001, {"ductor.handler": "bridge"})
    return queued


def baseline(_: str | None) -> None:
    msgspec.json.decode(msgspec.json.encode(PAYLOAD))


def per_step(
    fn: Callable[[str | None], object], stored: str | None, steps: int, repeat: int
) -> float:
    times = []
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(steps):
            fn(stored)
        times.append((time.process_time() - started) / steps)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    base = per_step(baseline, None, args.steps, args.repeat)
    rows = [
        ("no SDK, no stored context", per_step(step, None, args.steps, args.repeat)),
        ("no SDK, stored context (pass-through)", per_step(step, STORED, args.steps, args.repeat)),
    ]
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
    steps = max(args.steps // 10, 100)
    recorded = []
    for _ in range(args.repeat):
        started = time.process_time()
        for _ in range(steps):
            step(STORED)
        recorded.append((time.process_time() - started) / steps)
        exporter.clear()
    rows.append(("SDK recording 3 spans + 2 histograms", statistics.median(recorded)))
    print(f"baseline (encode+decode a task payload): {base * 1e6:8.2f} us/step")
    for name, seconds in rows:
        print(f"{name:40s} {seconds * 1e6:8.2f} us/step  {seconds / base:6.1f}x baseline")


if __name__ == "__main__":
    main()
