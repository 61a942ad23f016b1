"""The server's tracer and metric instruments, all named under `ductor.`.

Instruments are made once, at import, from the global meter: before an SDK's
meter provider is set they are no-ops, and they start recording the moment one
is (the API's proxies forward to it). docs/observability.md lists every
instrument with its unit and attributes; keep the two in step.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

tracer = trace.get_tracer("ductor")
"""The server's one tracer (instrumentation scope `ductor`)."""

meter = metrics.get_meter("ductor")
"""The server's one meter (instrumentation scope `ductor`)."""

DURATION_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
"""Histogram bucket bounds of every duration, in seconds (1 ms to 2 min)."""

API_DURATION = meter.create_histogram(
    "ductor.api.request.duration",
    unit="s",
    description="Time to answer an HTTP request, by method, route template and status.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
TICK_DURATION = meter.create_histogram(
    "ductor.coordinator.tick.duration",
    unit="s",
    description="Time to claim, tick and commit one coordinator batch of runs.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
ATTEMPT_DURATION = meter.create_histogram(
    "ductor.attempt.duration",
    unit="s",
    description="Time one attempt of a step took in its handler, by handler and outcome.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
TASK_WAIT = meter.create_histogram(
    "ductor.task.wait.duration",
    unit="s",
    description="Time a task waited in the queue, from ready to leased, by handler.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)
ROUTE_DURATION = meter.create_histogram(
    "ductor.route.decision.duration",
    unit="s",
    description="Time to route one routable and commit the decision, by outcome.",
    explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
)


class QueueDepthReadings:
    """The last counts of ready tasks per (tier, tenant), reported by the
    `ductor.queue.depth` gauge whenever a metric reader collects.

    The engine's sampler (`engine/queuedepth.py`) publishes them from a
    periodic count in the store; collecting only reads memory. A series that
    disappears from the counts is reported as 0 at the next collection, so a
    drained queue reads 0 rather than its last backlog, and then no more.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the SDK's reader collects from its own thread
        self._latest: dict[tuple[int, str], int] = {}
        self._gone: set[tuple[int, str]] = set()

    def publish(self, depths: Mapping[tuple[int, str], int]) -> None:
        """Replace the readings with `depths` ({(tier, tenant): ready tasks})."""
        with self._lock:
            gone = self._gone | (set(self._latest) - set(depths))
            self._gone = gone - set(depths)
            self._latest = dict(depths)

    def clear(self) -> None:
        """Forget the readings (the sampler stopped): the gauge reports nothing."""
        self.publish({})
        with self._lock:
            self._gone = set()

    def observe(self, options: CallbackOptions | None = None) -> Iterable[Observation]:
        """The gauge's callback."""
        with self._lock:
            latest, gone = dict(self._latest), self._gone
            self._gone = set()
        for tier, tenant in sorted(gone):
            yield Observation(0, {"ductor.tier": tier, "ductor.tenant": tenant})
        for (tier, tenant), count in sorted(latest.items()):
            yield Observation(count, {"ductor.tier": tier, "ductor.tenant": tenant})


QUEUE_DEPTH = QueueDepthReadings()
"""The readings behind `ductor.queue.depth` (one per process)."""

meter.create_observable_gauge(
    "ductor.queue.depth",
    callbacks=[QUEUE_DEPTH.observe],
    unit="{task}",
    description="Tasks ready to run and not yet leased, by tier and tenant.",
)


def attempt_outcome(*, ok: bool, code: str | None, retryable: bool) -> str:
    """The `ductor.outcome` of an attempt: `ok`, `timeout`, `poisoned`,
    `retryable_error` or `error` (a closed set: error codes are not attributes,
    as an app may choose its own)."""
    if ok:
        return "ok"
    if code == "step.timeout":
        return "timeout"
    if code == "attempt.poisoned":
        return "poisoned"
    return "retryable_error" if retryable else "error"


def tracing_enabled() -> bool:
    """Whether a tracer provider is set. Without one every span is non-recording
    and carries only the context it was started in, so a caller with no trace
    context to continue may skip making one.

    Called for every task and tick, so it asks what the API's own proxy tracer
    asks (its module's provider, set once); `trace.get_tracer_provider()` looks
    the environment up on every call until a provider is set. Should the API
    ever drop that name, the answer is True: spans are made, as before.
    """
    return bool(getattr(trace, "_TRACER_PROVIDER", True))


def metrics_enabled() -> bool:
    """Whether a meter provider other than the API's default (a no-op) is set."""
    return not type(metrics.get_meter_provider()).__module__.startswith("opentelemetry.metrics")


__all__ = [
    "API_DURATION",
    "ATTEMPT_DURATION",
    "DURATION_BUCKETS",
    "QUEUE_DEPTH",
    "ROUTE_DURATION",
    "TASK_WAIT",
    "TICK_DURATION",
    "QueueDepthReadings",
    "attempt_outcome",
    "meter",
    "metrics_enabled",
    "tracer",
    "tracing_enabled",
]
