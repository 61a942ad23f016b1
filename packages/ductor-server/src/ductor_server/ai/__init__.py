"""The inference proxy's tables and errors (the rules are `services.ai`'s): no
transport, no HTTP to the upstream here."""

from __future__ import annotations

from ductor_server.ai.errors import (
    AiConnectionUnsupported,
    AiNoConnection,
    AiRequestNotFound,
    AiUpstreamError,
    AiUpstreamTimeout,
    PriceNotFound,
)
from ductor_server.ai.store import AiRequestRecord, AiSettingsRecord, AiTx, PriceRecord

__all__ = [
    "AiConnectionUnsupported",
    "AiNoConnection",
    "AiRequestNotFound",
    "AiRequestRecord",
    "AiSettingsRecord",
    "AiTx",
    "AiUpstreamError",
    "AiUpstreamTimeout",
    "PriceNotFound",
    "PriceRecord",
]
