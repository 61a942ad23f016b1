"""The server's errors, each a `DuctorError` with a stable code; no HTTP here.

    DuctorError (ductor_core)
     └── ServerError
          ├── NotFoundError
          │    ├── RunNotFound                 run.not_found
          │    ├── InboxNotFound               inbox.not_found (a subscriber's feed)
          │    ├── NotificationNotFound        notification.not_found
          │    ├── EmailNotFound               email.not_found (an inbox email)
          │    ├── WorkflowNotFound            workflow.not_found
          │    ├── WorkflowVersionNotFound     workflow.version_not_found
          │    ├── KeyNotFound                 key.not_found (an API key of the tenant)
          │    └── TenantNotFound              tenant.not_found
          ├── DefinitionInvalid                definition.invalid (details: problems)
          ├── RequestInvalid                   request.invalid
          ├── NotificationNotActionable        notification.not_actionable
          ├── EventInvalid                     event.invalid
          ├── RunNotCancellable                run.not_cancellable
          ├── RunNotEnded                      run.not_ended (a re-run of a run still going)
          ├── RunEnded                         run.ended (a signal to a finished run)
          ├── RunInputInvalid                  run.input_invalid (details: problems)
          ├── Unauthenticated                  auth.unauthenticated
          │    └── KeyExpired                  auth.key_expired
          ├── Forbidden                        auth.forbidden (the key lacks a scope)
          ├── KeyInvalid                       key.invalid (details: problems)
          ├── LastAdminKey                     key.last_admin
          ├── TenantInvalid                    tenant.invalid (details: problems)
          ├── TenantConflict                   tenant.conflict
          ├── IdempotencyConflict              idempotency.conflict
          └── BridgeNotConfigured              bridge.not_configured (retryable)

Transports map each `code` to their status in one table
(`transports/rest/errors.py` for HTTP).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from ductor_core.errors import DuctorError
from ductor_core.timestamps import utc_text


class ServerError(DuctorError):
    """Base of the errors the service layer raises."""

    code = "server.error"


class NotFoundError(ServerError):
    """Something the tenant asked for does not exist (or belongs to another tenant)."""

    code = "not_found"


class RunNotFound(NotFoundError):
    """No run with this id for this tenant."""

    code = "run.not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} not found", details={"run_id": run_id})


class InboxNotFound(NotFoundError):
    """No inbox for these subscriber credentials: the tenant has no inbox secret,
    or the subscriber token is not the HMAC of this subscriber id under it."""

    code = "inbox.not_found"

    def __init__(self) -> None:
        super().__init__("no inbox for this subscriber and token")


class NotificationNotFound(NotFoundError):
    """No notification with this id for this tenant (and subscriber)."""

    code = "notification.not_found"

    def __init__(self, notification_id: str) -> None:
        super().__init__(
            f"notification {notification_id!r} not found",
            details={"notification_id": notification_id},
        )


class EmailNotFound(NotFoundError):
    """No inbox email with this id for this tenant."""

    code = "email.not_found"

    def __init__(self, email_id: str) -> None:
        super().__init__(f"email {email_id!r} not found", details={"email_id": email_id})


class NotificationNotActionable(ServerError):
    """The clicked CTA does not exist or is a link, not an action."""

    code = "notification.not_actionable"


class WorkflowNotFound(NotFoundError):
    """No workflow family with this slug for this tenant."""

    code = "workflow.not_found"

    def __init__(self, family_slug: str) -> None:
        super().__init__(
            f"workflow {family_slug!r} not found", details={"family_slug": family_slug}
        )


class WorkflowVersionNotFound(NotFoundError):
    """The family exists but not at this version."""

    code = "workflow.version_not_found"

    def __init__(self, family_slug: str, version: int) -> None:
        super().__init__(
            f"workflow {family_slug!r} has no version {version}",
            details={"family_slug": family_slug, "version": version},
        )


class DefinitionInvalid(ServerError):
    """A definition failed validation; `details` is the list of problems."""

    code = "definition.invalid"


class RequestInvalid(ServerError):
    """A request is malformed or names something impossible."""

    code = "request.invalid"


class EventInvalid(ServerError):
    """An event is malformed (empty name, id reused with other content, ...)."""

    code = "event.invalid"


class RunNotCancellable(ServerError):
    """The run has already ended and cannot be cancelled."""

    code = "run.not_cancellable"

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(
            f"run {run_id!r} has already ended ({status})",
            details={"run_id": run_id, "status": status},
        )


class RunNotEnded(ServerError):
    """The run has not ended yet, so it cannot be re-run."""

    code = "run.not_ended"

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(
            f"run {run_id!r} has not ended yet ({status}); re-run it once it has",
            details={"run_id": run_id, "status": status},
        )


class RunWaitLimit(ServerError):
    """The tenant has as many requests waiting for runs to end as one process holds."""

    code = "run.wait_limit"

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this tenant already has {limit} requests waiting for runs to end on this"
            " server; wait for fewer runs at once, or ask again without `wait`",
            details={"limit": limit},
        )


class InboxSocketLimit(ServerError):
    """A subscriber, or its tenant, holds as many live inbox sockets as one
    process allows, or as many sockets as it allows wait for their `auth`
    message (`holder` "unauthenticated")."""

    code = "inbox.socket_limit"

    def __init__(self, holder: str, limit: int) -> None:
        if holder == "unauthenticated":
            message = (
                f"{limit} inbox sockets are already waiting for their auth message on this"
                " server; try again shortly, and send auth as soon as the socket opens"
            )
        else:
            message = (
                f"this {holder} already has {limit} live inbox sockets open on this server;"
                " close one, or read GET /v1/inbox/me/changes instead"
            )
        super().__init__(message, details={"limit": limit, "per": holder})


class RunEnded(ServerError):
    """The run has already ended, so it takes no more signals."""

    code = "run.ended"

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(
            f"run {run_id!r} has already ended ({status})",
            details={"run_id": run_id, "status": status},
        )


class RunInputInvalid(ServerError):
    """A run's input does not satisfy its workflow version's `input_schema`.

    `details` holds `pointer` (the first problem's), `problems` (each
    `{"pointer", "message"}`, pointers from the request's root: `/input/total`)
    and the `family_slug` refused."""

    code = "run.input_invalid"
    retryable = False

    def __init__(self, family_slug: str, problems: list[dict[str, str]]) -> None:
        first = problems[0] if problems else {"pointer": "/input", "message": "is invalid"}
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(
            f"the input does not satisfy the input_schema of {family_slug}: "
            f"{first['pointer']} {first['message']}{more}",
            details={"pointer": first["pointer"], "problems": problems, "family_slug": family_slug},
        )
        self.family_slug = family_slug
        self.problems = problems
        self.start_index = 0  # which of a batch of starts it refused (`create_runs`)

    def under(self, prefix: str) -> RunInputInvalid:
        """The same refusal with every pointer under `prefix` ("/runs/3")."""
        moved = [{**p, "pointer": prefix + p["pointer"]} for p in self.problems]
        return RunInputInvalid(self.family_slug, moved)


class Unauthenticated(ServerError):
    """No valid API key was presented."""

    code = "auth.unauthenticated"


class KeyExpired(Unauthenticated):
    """The API key was valid until its expiry time, which has passed."""

    code = "auth.key_expired"

    def __init__(self, expired_at: datetime) -> None:
        super().__init__(
            f"API key expired at {utc_text(expired_at)}: create a new one",
            details={"expired_at": utc_text(expired_at)},
        )


class Forbidden(ServerError):
    """The API key is valid but lacks the scope the call needs."""

    code = "auth.forbidden"

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message, details=details)


class _Problems(ServerError):
    """Something was refused for every problem in `details` (`{"pointer", "message"}`)."""

    def __init__(self, problems: list[dict[str, str]]) -> None:
        first = problems[0]["message"] if problems else "invalid request"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(f"{first}{more}", details=problems)


class KeyInvalid(_Problems):
    """A new API key's name, scopes or expiry are wrong; `details` lists every problem
    as `{"pointer", "message"}` (pointers into the request body)."""

    code = "key.invalid"


class KeyNotFound(NotFoundError):
    """No API key with this id for this tenant."""

    code = "key.not_found"

    def __init__(self, key_id: str) -> None:
        super().__init__(f"API key {key_id!r} not found", details={"key_id": key_id})


class LastAdminKey(ServerError):
    """Revoking the key would leave the tenant without a live admin key."""

    code = "key.last_admin"

    def __init__(self, key_id: str) -> None:
        super().__init__(
            f"API key {key_id!r} is the tenant's last live admin key: create another admin"
            " key before revoking it",
            details={"key_id": key_id},
        )


class TenantInvalid(_Problems):
    """A new tenant's id or name is wrong; `details` lists every problem."""

    code = "tenant.invalid"


class TenantNotFound(NotFoundError):
    """No tenant with this id."""

    code = "tenant.not_found"

    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"tenant {tenant_id!r} not found", details={"tenant_id": tenant_id})


class TenantConflict(ServerError):
    """A tenant with this id exists already."""

    code = "tenant.conflict"

    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"tenant {tenant_id!r} exists already", details={"tenant_id": tenant_id})


class IdempotencyConflict(ServerError):
    """An idempotency key was reused with a different request."""

    code = "idempotency.conflict"

    def __init__(self, message: str, *, details: Any = None) -> None:
        super().__init__(message, details=details)


class BridgeNotConfigured(ServerError):
    """The server has no bridge signing key."""

    code = "bridge.not_configured"
    retryable = True

    def __init__(self) -> None:
        super().__init__("the server has no bridge signing key: set DUCTOR_BRIDGE_SIGNING_KEY")


MAX_MESSAGE_CHARS = 2_000
"""The longest `message` an error answer carries, cut included (see `bounded`)."""
MAX_DETAIL_CHARS = 1_000
"""The longest text among an error answer's `details` (an id or slug it repeats)."""


def _clipped(text: str, limit: int) -> str:
    """`text`, or its start and how much was cut, in at most `limit` characters
    (so cutting twice cuts once)."""
    if len(text) <= limit:
        return text
    keep = limit - len(f"… ({len(text)} more characters)")
    return f"{text[:keep]}… ({len(text) - keep} more characters)"


def _clipped_details(value: Any, depth: int = 0) -> Any:
    if isinstance(value, str):
        return _clipped(value, MAX_DETAIL_CHARS)
    if depth >= 32:  # deeper than any details the server builds
        return value
    if isinstance(value, dict):
        return {key: _clipped_details(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_clipped_details(item, depth + 1) for item in value]
    return value


def bounded(message: str, details: Any) -> tuple[str, Any]:
    """An error answer's message and plain-JSON details as every transport sends
    them: what a request sent and an error repeats (a 100 KB slug, a long path)
    is cut, so an answer is never a multiple of its request."""
    if details is not None:
        details = _clipped_details(msgspec.to_builtins(details))
    return _clipped(message, MAX_MESSAGE_CHARS), details


def shown(error: DuctorError) -> tuple[str, Any]:
    """`bounded`, for `error`."""
    return bounded(error.message, error.details)


__all__ = [
    "MAX_DETAIL_CHARS",
    "MAX_MESSAGE_CHARS",
    "BridgeNotConfigured",
    "DefinitionInvalid",
    "EmailNotFound",
    "EventInvalid",
    "Forbidden",
    "IdempotencyConflict",
    "InboxNotFound",
    "InboxSocketLimit",
    "KeyExpired",
    "KeyInvalid",
    "KeyNotFound",
    "LastAdminKey",
    "NotFoundError",
    "NotificationNotActionable",
    "NotificationNotFound",
    "RequestInvalid",
    "RunEnded",
    "RunInputInvalid",
    "RunNotCancellable",
    "RunNotEnded",
    "RunNotFound",
    "ServerError",
    "TenantConflict",
    "TenantInvalid",
    "TenantNotFound",
    "Unauthenticated",
    "WorkflowNotFound",
    "WorkflowVersionNotFound",
    "bounded",
    "shown",
]
