"""The Ductor bridge SDK: host durable workflows in application code.

Define workflow bodies as `async def body(ctx, input)` on a `Client`, serve
them with an adapter (`ductor.asgi`, `ductor.starlette`, `ductor.litestar`),
and talk to the server's REST API with `ductor.api`. The wire protocol the
server shares is `ductor.protocol`.
"""

from __future__ import annotations

from ductor._replay import Context, Steps
from ductor._version import __version__
from ductor.client import (
    BridgeResponse,
    CancelContext,
    CancelHandler,
    Client,
    Concurrency,
    InlineRun,
    Rate,
    Trigger,
    Workflow,
    WorkflowFn,
)
from ductor.errors import (
    ApiError,
    DuctorError,
    DurationError,
    NonDeterminismError,
    NonRetriableError,
    ProtocolError,
    RetryAfterError,
    SignatureError,
    StepFailed,
    StepInterrupt,
    WorkflowNotFound,
)
from ductor.protocol import Event, Signal

__all__ = [
    "ApiError",
    "BridgeResponse",
    "CancelContext",
    "CancelHandler",
    "Client",
    "Concurrency",
    "Context",
    "DuctorError",
    "DurationError",
    "Event",
    "InlineRun",
    "NonDeterminismError",
    "NonRetriableError",
    "ProtocolError",
    "Rate",
    "RetryAfterError",
    "Signal",
    "SignatureError",
    "StepFailed",
    "StepInterrupt",
    "Steps",
    "Trigger",
    "Workflow",
    "WorkflowFn",
    "WorkflowNotFound",
    "__version__",
]
