"""The `webhook` provider: events POSTed to one URL, signed as the Standard Webhooks
specification says (https://www.standardwebhooks.com), so a receiver verifies them
with any of its libraries.

Each request carries `webhook-id` (the attempt's idempotency key, so a retried
attempt sends the same id and the receiver can drop the duplicate),
`webhook-timestamp` (the server clock's seconds) and `webhook-signature`
(`v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">` under the connection's
`whsec_` secret). It must never send or report the secret.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

import msgspec
from standardwebhooks import Webhook

from ductor_core.runs import ErrorInfo
from ductor_core.timestamps import utc_text
from ductor_server.engine.outbound import is_retryable_status
from ductor_server.providers._exchange import (
    Redactor,
    check_url,
    elapsed_ms,
    exchange,
    failed_test,
    unknown_operation,
)
from ductor_server.providers.base import (
    CallContext,
    CheckResult,
    Operation,
    ProviderFailed,
)

SECRET_PREFIX = "whsec_"
# `(?!\n)`: Python's `$` also matches before a trailing line break (the schema's
# readers, with ECMAScript regexes, see the same rule).
EventType = Annotated[
    str, msgspec.Meta(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:\-]+(?!\n)$")
]


class WebhookSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `config`.

    Attributes:
        url: the receiver's absolute http(s) URL (a query is kept).
    """

    url: str

    def __post_init__(self) -> None:
        check_url(self.url, query=True)


class WebhookSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `secrets`.

    Attributes:
        signing_secret: `whsec_` followed by the base64 of 24 to 64 random bytes.
    """

    signing_secret: str

    def __post_init__(self) -> None:
        if not self.signing_secret.startswith(SECRET_PREFIX):
            raise ValueError(f"signing_secret must start with {SECRET_PREFIX}")
        try:
            key = base64.b64decode(self.signing_secret[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"signing_secret must be {SECRET_PREFIX} and base64") from None
        if not 24 <= len(key) <= 64:
            raise ValueError("signing_secret must hold 24 to 64 bytes")


class SendEventInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The input of `send`.

    Attributes:
        type: the event type (`order.paid`): letters, digits and `_ . : -`.
        data: the event's JSON payload.
    """

    type: EventType
    data: Any = None


class SendEventOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The output of `send`.

    Attributes:
        status: the receiver's HTTP status (2xx).
        webhook_id: the `webhook-id` sent (the attempt's idempotency key).
    """

    status: int
    webhook_id: str


def signed_request(
    secrets: WebhookSecrets, webhook_id: str, now: float, event_type: str, data: Any
) -> tuple[dict[str, str], bytes]:
    """The headers and body of one signed event.

    The body is `{"type", "timestamp" (RFC 3339, UTC), "data"}`, the payload
    shape the specification recommends.
    """
    moment = datetime.fromtimestamp(int(now), tz=UTC)
    body = msgspec.json.encode({"type": event_type, "timestamp": utc_text(moment), "data": data})
    signature = Webhook(secrets.signing_secret).sign(webhook_id, moment, body.decode())
    headers = {
        "Content-Type": "application/json",
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(now)),
        "webhook-signature": signature,
    }
    return headers, body


class WebhookProvider:
    """The `webhook` provider (one instance serves every connection)."""

    name: str = "webhook"
    description: str = "Events POSTed to a URL, signed per Standard Webhooks."
    settings: type[msgspec.Struct] = WebhookSettings
    secrets: type[msgspec.Struct] = WebhookSecrets
    operations: Mapping[str, Operation] = {
        "send": Operation(
            name="send",
            description="POST one signed event to the connection's URL.",
            input=SendEventInput,
            output=SendEventOutput,
        )
    }

    async def call(
        self,
        operation: str,
        settings: WebhookSettings,
        secrets: WebhookSecrets,
        input: SendEventInput,
        context: CallContext,
    ) -> Any:
        """Run `send`: 2xx gives `{status, webhook_id}`; other answers fail as
        `webhook.<status>` (5xx, 408, 425 and 429 retryable)."""
        if operation != "send":
            raise unknown_operation(self.name, operation)
        return msgspec.to_builtins(
            await self._send(settings, secrets, input.type, input.data, context)
        )

    async def _send(
        self,
        settings: WebhookSettings,
        secrets: WebhookSecrets,
        event_type: str,
        data: Any,
        context: CallContext,
    ) -> SendEventOutput:
        webhook_id = context.idempotency_key
        headers, body = signed_request(secrets, webhook_id, context.now, event_type, data)
        redactor = Redactor([secrets.signing_secret, secrets.signing_secret[len(SECRET_PREFIX) :]])
        what = f"POST {settings.url}"
        answer = await exchange(
            context,
            provider="webhook",
            method="POST",
            url=settings.url,
            what=what,
            redactor=redactor,
            headers=headers,
            content=body,
        )
        if answer.ok:
            return SendEventOutput(status=answer.status, webhook_id=webhook_id)
        raise ProviderFailed(
            ErrorInfo(
                code=f"webhook.{answer.status}",
                message=f"{what} answered {answer.status}",
                retryable=is_retryable_status(answer.status),
                retry_after_seconds=answer.retry_after_seconds,
                details={
                    "status": answer.status,
                    "webhook_id": webhook_id,
                    "headers": answer.headers,
                    "body": answer.body,
                },
            )
        )

    async def test(
        self, settings: WebhookSettings, secrets: WebhookSecrets, context: CallContext
    ) -> CheckResult:
        """Send a signed `ductor.test` event (data `{"connection": <name>}`): ok when
        the receiver answers 2xx."""
        started = time.perf_counter()
        try:
            sent = await self._send(
                settings, secrets, "ductor.test", {"connection": context.connection}, context
            )
        except ProviderFailed as exc:
            return failed_test(exc, started)
        return CheckResult(
            ok=True,
            message=f"POST {settings.url} answered {sent.status} to a ductor.test event",
            latency_ms=elapsed_ms(started),
            details={"status": sent.status, "webhook_id": sent.webhook_id},
        )


__all__ = [
    "SendEventInput",
    "SendEventOutput",
    "WebhookProvider",
    "WebhookSecrets",
    "WebhookSettings",
    "signed_request",
]
