"""The `slack` provider: messages posted through a Slack incoming webhook.

The webhook URL is the credential (whoever has it can post), so it is the
connection's secret: it never appears in an error, a detail or an output.
Slack answers `ok` or an error word (`invalid_payload`, `no_service`, ...),
which becomes the error code `slack.<word>`. Incoming webhooks take no
idempotency key: a repeated attempt may post twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from ductor_core.runs import ErrorInfo
from ductor_server.engine.outbound import is_retryable_status
from ductor_server.providers._exchange import (
    Answer,
    Redactor,
    check_url,
    elapsed_ms,
    exchange,
    failed_test,
    unknown_operation,
)
from ductor_server.providers.base import CallContext, CheckResult, Operation, ProviderFailed

_ERROR_WORD = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_WHAT = "POST to the Slack webhook"
# What a live webhook answers to an empty message.
_LIVE_WORDS = ("no_text", "invalid_payload")


class SlackSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `config` (none: everything is in the secret URL)."""


class SlackSecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `secrets`.

    Attributes:
        webhook_url: the incoming webhook's URL (`https://hooks.slack.com/services/...`).
    """

    webhook_url: str

    def __post_init__(self) -> None:
        try:
            check_url(self.webhook_url, query=True)
        except ValueError as exc:
            raise ValueError(f"webhook_url {exc}") from None

    def redactor(self) -> Redactor:
        """Keeps the URL, and its path (the token part), out of errors."""
        path = urlsplit(self.webhook_url).path
        return Redactor([self.webhook_url, path if len(path) > 8 else None])


class PostMessageInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The input of `post_message`.

    Attributes:
        text: the message (mrkdwn), also the notification text when `blocks` are given.
        blocks: Block Kit blocks.
        username: the name to post as (if the app may override it).
        icon_emoji: the emoji to post with (`:robot_face:`).
    """

    text: str
    blocks: list[dict[str, Any]] | None = None
    username: str | None = None
    icon_emoji: str | None = None


class PostMessageOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The output of `post_message`.

    Attributes:
        ok: true (Slack took the message).
    """

    ok: bool


class SlackProvider:
    """The `slack` provider (one instance serves every connection)."""

    name: str = "slack"
    description: str = "Messages through a Slack incoming webhook."
    settings: type[msgspec.Struct] = SlackSettings
    secrets: type[msgspec.Struct] = SlackSecrets
    operations: Mapping[str, Operation] = {
        "post_message": Operation(
            name="post_message",
            description="Post one message to the webhook's channel.",
            input=PostMessageInput,
            output=PostMessageOutput,
        )
    }

    async def call(
        self,
        operation: str,
        settings: SlackSettings,
        secrets: SlackSecrets,
        input: PostMessageInput,
        context: CallContext,
    ) -> Any:
        """Run `post_message`: `{ok: true}`, or fail as `slack.<error word>`."""
        if operation != "post_message":
            raise unknown_operation(self.name, operation)
        payload = {k: v for k, v in msgspec.to_builtins(input).items() if v is not None}
        answer = await _post(secrets, payload, context)
        if answer.ok:
            return {"ok": True}
        raise _failure(answer)

    async def test(
        self, settings: SlackSettings, secrets: SlackSecrets, context: CallContext
    ) -> CheckResult:
        """POST an empty message (`{}`), which posts nothing: a live webhook answers
        `no_text` or `invalid_payload`; a revoked one `no_service`,
        `invalid_token`, `channel_not_found` or the like."""
        started = time.perf_counter()
        try:
            answer = await _post(secrets, {}, context)
        except ProviderFailed as exc:
            return failed_test(exc, started)
        code = None if answer.ok else _failure(answer).error.code
        ok = code is None or code.removeprefix("slack.") in _LIVE_WORDS
        return CheckResult(
            ok=ok,
            message=(
                "the webhook is live" if ok else f"the webhook answered {answer.status} ({code})"
            ),
            latency_ms=elapsed_ms(started),
            details={"status": answer.status, "code": code},
        )


async def _post(secrets: SlackSecrets, payload: dict[str, Any], context: CallContext) -> Answer:
    return await exchange(
        context,
        provider="slack",
        method="POST",
        url=secrets.webhook_url,
        what=_WHAT,
        redactor=secrets.redactor(),
        headers={"Content-Type": "application/json"},
        content=msgspec.json.encode(payload),
        max_bytes=64 * 1024,
    )


def _failure(answer: Answer) -> ProviderFailed:
    word = answer.body.strip() if isinstance(answer.body, str) else ""
    code = f"slack.{word}" if _ERROR_WORD.fullmatch(word) else f"slack.{answer.status}"
    return ProviderFailed(
        ErrorInfo(
            code=code,
            message=f"{_WHAT} answered {answer.status}"
            + (f": {word}" if _ERROR_WORD.fullmatch(word) else ""),
            retryable=is_retryable_status(answer.status),
            retry_after_seconds=answer.retry_after_seconds,
            details={"status": answer.status},
        )
    )


__all__ = [
    "PostMessageInput",
    "PostMessageOutput",
    "SlackProvider",
    "SlackSecrets",
    "SlackSettings",
]
