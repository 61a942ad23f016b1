"""The inbox's email channel as the tenant sees it: subscriber profiles (the
address an email goes to), the outbox emails and their delivery state, and the
outbox row a send through the API queues.

Sending is not here: the engine's email loop sends what the outbox holds.
Transport-neutral: nothing here knows HTTP.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import msgspec

from ductor_core.notification_fields import SUBSCRIBER_ID_RULE, is_subscriber_id
from ductor_server.connections.store import ConnectionsTx
from ductor_server.engine.notify import EMAIL_PROVIDER, email_id, outbox_email
from ductor_server.errors import EmailNotFound, RequestInvalid
from ductor_server.providers.smtp import is_address
from ductor_server.services.cursors import parse_time_cursor, time_cursor
from ductor_server.storage.emails import Email, EmailStatus, EmailsTx
from ductor_server.storage.notifications import InboxTx
from ductor_server.storage.protocol import Store, Tx

MAX_SUBJECT = 998
"""The longest email subject, in characters (RFC 5322's line limit)."""

STATUSES = tuple(s.value for s in EmailStatus)
"""The `status` filters of an email list."""


class EmailOption(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`email` of a send through the API: the tenant's SMTP connection, and a
    subject (the title if not given)."""

    connection: str
    subject: str | None = None


class SubscriberBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PUT /v1/inbox/subscribers/{id}`: the subscriber's profile (`email` null: none)."""

    email: str | None = None


class SubscriberView(msgspec.Struct, frozen=True, kw_only=True):
    """A subscriber's profile."""

    subscriber_id: str
    email: str | None


class EmailView(msgspec.Struct, frozen=True, kw_only=True):
    """An outbox email and how far it got: `pending` (queued, or waiting to be
    retried at `next_attempt_at`), `sent` or `failed` (`error` says why)."""

    id: str
    subscriber_id: str
    to: str
    connection: str
    subject: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    message_id: str | None
    error: dict[str, Any] | None
    notification_id: str | None
    workflow: str | None
    run_id: str | None
    step_ref: str | None
    created_at: datetime
    updated_at: datetime
    sent_at: datetime | None


class EmailPage(msgspec.Struct, frozen=True, kw_only=True):
    """A page of outbox emails, oldest first; `next_cursor` when there are more."""

    emails: list[EmailView]
    next_cursor: str | None


def email_view(e: Email) -> EmailView:
    """The tenant's view of an outbox row."""
    return EmailView(
        id=e.id,
        subscriber_id=e.subscriber_id,
        to=e.to_address,
        connection=e.connection,
        subject=e.subject,
        status=e.status.value,
        attempts=e.attempts,
        next_attempt_at=e.next_at if e.status is EmailStatus.PENDING else None,
        message_id=e.message_id,
        error=e.error,
        notification_id=e.notification_id,
        workflow=e.workflow,
        run_id=e.run_id,
        step_ref=e.step_ref,
        created_at=e.created_at,
        updated_at=e.updated_at,
        sent_at=e.sent_at,
    )


def check_email_option(option: EmailOption) -> None:
    """Refuse an `email` option whose fields are out of bounds (no store read).

    Raises:
        RequestInvalid: with the pointer of the field.
    """
    if not option.connection.strip() or len(option.connection) > 63:
        raise RequestInvalid(
            "email.connection must name one of the tenant's connections",
            details={"pointer": "/email/connection"},
        )
    if option.subject is not None and len(option.subject) > MAX_SUBJECT:
        raise RequestInvalid(
            f"email.subject is at most {MAX_SUBJECT} characters",
            details={"pointer": "/email/subject"},
        )


async def require_email_connection(tx: Tx, tenant_id: str, name: str) -> None:
    """Refuse a connection the tenant does not have or that is not an SMTP one.

    Raises:
        RequestInvalid: pointer `/email/connection`.
    """
    provider = (await ConnectionsTx(tx).names(tenant_id, [name])).get(name)
    if provider is None:
        raise RequestInvalid(
            f"the tenant has no connection named {name[:64]!r}",
            details={"pointer": "/email/connection"},
        )
    if provider != EMAIL_PROVIDER:
        raise RequestInvalid(
            f"email needs an {EMAIL_PROVIDER!r} connection; {name!r} uses provider {provider!r}",
            details={"pointer": "/email/connection"},
        )


async def queue_api_email(
    tx: Tx,
    *,
    tenant_id: str,
    subscriber_id: str,
    option: EmailOption,
    source: str,
    title: str,
    body: str,
    ctas: list[dict[str, Any]],
    notification_id: str | None,
    now: datetime,
) -> dict[str, Any]:
    """Queue the email of a send through the API (the caller checked the
    preferences); return what the answer says of it."""
    address = (await InboxTx(tx).emails(tenant_id, [subscriber_id])).get(subscriber_id)
    if address is None:
        return {"queued": False, "reason": "no_address"}
    row = outbox_email(
        tenant_id=tenant_id,
        id=email_id(tenant_id, source, subscriber_id),
        subscriber_id=subscriber_id,
        address=address,
        connection=option.connection,
        subject=option.subject or title,
        title=title,
        body=body,
        ctas=ctas,
        now=now,
        notification_id=notification_id,
    )
    await EmailsTx(tx).insert([row])
    return {"queued": True, "id": row.id, "to": address}


def _cursor(e: Email) -> str:
    return time_cursor(e.created_at, e.id)


class InboxEmail:
    """Subscriber profiles and the outbox, for the tenant."""

    def __init__(self, store: Store, *, max_page: int = 200) -> None:
        self._store = store
        self._max_page = max_page

    async def subscriber(self, tenant_id: str, subscriber_id: str) -> SubscriberView:
        """A subscriber's profile (`email` null when none was set)."""
        async with self._store.transaction() as tx:
            found = await InboxTx(tx).emails(tenant_id, [subscriber_id])
        return SubscriberView(subscriber_id=subscriber_id, email=found.get(subscriber_id))

    async def set_subscriber(
        self, tenant_id: str, subscriber_id: str, body: SubscriberBody
    ) -> SubscriberView:
        """Set a subscriber's profile.

        Raises:
            RequestInvalid: `email` is not a plain address (`local@domain`).
        """
        if body.email is not None and not is_address(body.email):
            raise RequestInvalid(
                "email must be an address like ann@example.com (ASCII, no display name,"
                " at most 254 characters)",
                details={"pointer": "/email"},
            )
        async with self._store.transaction() as tx:
            await InboxTx(tx).set_email(tenant_id, subscriber_id, body.email)
        return SubscriberView(subscriber_id=subscriber_id, email=body.email)

    async def list_emails(
        self,
        tenant_id: str,
        *,
        run_id: str | None = None,
        subscriber_id: str | None = None,
        status: str | None = None,
        cursor: str | None = None,
        limit: int = 50,
    ) -> EmailPage:
        """The tenant's outbox emails, oldest first; an empty filter or `cursor` is
        the same as none.

        Raises:
            RequestInvalid: a subscriber id that is not one, unknown status, bad
                cursor or limit.
        """
        run_id, subscriber_id, status = run_id or None, subscriber_id or None, status or None
        if subscriber_id is not None and not is_subscriber_id(subscriber_id):
            raise RequestInvalid(
                f"subscriber_id {SUBSCRIBER_ID_RULE}", details={"pointer": "subscriber_id"}
            )
        if status is not None and status not in STATUSES:
            raise RequestInvalid(
                f"status must be one of {', '.join(STATUSES)}", details={"pointer": "status"}
            )
        if not 1 <= limit <= self._max_page:
            raise RequestInvalid(f"limit is 1 to {self._max_page}", details={"pointer": "limit"})
        after = parse_time_cursor(cursor) if cursor else None
        async with self._store.transaction() as tx:
            rows = await EmailsTx(tx).list_emails(
                tenant_id,
                run_id=run_id,
                subscriber_id=subscriber_id,
                status=status,
                after=after,
                limit=limit + 1,
            )
        more = len(rows) > limit
        rows = rows[:limit]
        return EmailPage(
            emails=[email_view(e) for e in rows],
            next_cursor=_cursor(rows[-1]) if more and rows else None,
        )

    async def get_email(self, tenant_id: str, email_id: str) -> EmailView:
        """One outbox email.

        Raises:
            EmailNotFound: the tenant has no email of this id.
        """
        async with self._store.transaction() as tx:
            found = await EmailsTx(tx).get(tenant_id, email_id)
        if found is None:
            raise EmailNotFound(email_id)
        return email_view(found)


__all__ = [
    "EmailOption",
    "EmailPage",
    "EmailView",
    "InboxEmail",
    "SubscriberBody",
    "SubscriberView",
    "check_email_option",
    "email_view",
    "queue_api_email",
    "require_email_connection",
]
