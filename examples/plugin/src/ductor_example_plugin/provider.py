"""A provider (`ductor.providers`): `echo`, whose one operation answers its input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ductor_server.providers import CallContext, CheckResult, Operation, provider_failure


class EchoSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's settings: a prefix put before each echoed message."""

    prefix: str = ""


class EchoSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An echo connection keeps no secret."""


class EchoInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What to echo."""

    message: str


class EchoOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The echoed message and the attempt key it came with."""

    message: str
    idempotency_key: str


class EchoProvider:
    """Answers its input: a provider to try connections and ACTION steps with."""

    name = "echo"
    description = "answers its input (an example plugin provider)"
    settings = EchoSettings
    secrets = EchoSecrets
    operations: Mapping[str, Operation] = {
        "echo": Operation(
            name="echo", description="answer the message", input=EchoInput, output=EchoOutput
        )
    }

    async def call(
        self, operation: str, settings: Any, secrets: Any, input: Any, context: CallContext
    ) -> Any:
        if operation != "echo":
            raise provider_failure(
                "echo.unknown_operation", f"no operation {operation!r}", retryable=False
            )
        return {
            "message": settings.prefix + input.message,
            "idempotency_key": context.idempotency_key,
        }

    async def test(self, settings: Any, secrets: Any, context: CallContext) -> CheckResult:
        return CheckResult(ok=True, message="echo is always there")
