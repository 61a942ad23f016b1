"""The server's errors, each a `DuctorError` with a stable code; no HTTP here.

    DuctorError (ductor_core)
     └── ServerError
          ├── NotFoundError
          │    ├── RunNotFound                 run.not_found
          │    ├── InboxNotFound               inbox.not_found (a subscriber's feed)
          │    ├── NotificationNotFound        notification.not_found
          │    ├── EmailNotFound               email.not_found (an inbox email)
          │    ├── WorkflowNotFound            workflow.not_found
          │    └── WorkflowVersionNotFound     workflow.version_not_found
          ├── DefinitionInvalid                definition.invalid (details: problems)
          ├── RequestInvalid                   request.invalid
          ├── NotificationNotActionable        notification.not_actionable
          ├── EventInvalid                     event.invalid
          ├── RunNotCancellable                run.not_cancellable
          ├── RunEnded                         run.ended (a signal to a finished run)
          ├── Unauthenticated                  auth.unauthenticated
          ├── OperatorOnly                     auth.operator_only
          ├── IdempotencyConflict              idempotency.conflict
          └── BridgeNotConfigured              bridge.not_configured (retryable)

Transports map each `code` to their status in one table
(`transports/rest/errors.py` for HTTP).
"""

from __future__ import annotations

from typing import Any

from ductor_core.errors import DuctorError


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


class RunEnded(ServerError):
    """The run has already ended, so it takes no more signals."""

    code = "run.ended"

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(
            f"run {run_id!r} has already ended ({status})",
            details={"run_id": run_id, "status": status},
        )


class Unauthenticated(ServerError):
    """No valid API key was presented."""

    code = "auth.unauthenticated"


class OperatorOnly(ServerError):
    """An operator's call (`/v1/admin`) made without the operator key."""

    code = "auth.operator_only"


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


__all__ = [
    "BridgeNotConfigured",
    "DefinitionInvalid",
    "EmailNotFound",
    "EventInvalid",
    "IdempotencyConflict",
    "InboxNotFound",
    "NotFoundError",
    "NotificationNotActionable",
    "NotificationNotFound",
    "OperatorOnly",
    "RequestInvalid",
    "RunEnded",
    "RunNotCancellable",
    "RunNotFound",
    "ServerError",
    "Unauthenticated",
    "WorkflowNotFound",
    "WorkflowVersionNotFound",
]
