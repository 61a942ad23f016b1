"""Writing the notifications a NOTIFY step's tick asked for (`SendNotifications`),
in the transaction that commits the tick, the email outbox rows for the
recipients who want email, and the preference rules that decide who gets what.

Nothing here reads the clock or talks to the network: an email is only written
to the outbox (`inbox_emails`) here; the engine's email loop (`engine/emails.py`)
sends it. Notification and email ids are hashes of the tenant, the step's group
and the subscriber, so a repeated command writes nothing twice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ductor_core.runs import SendNotifications
from ductor_server.storage.emails import Email, EmailsTx
from ductor_server.storage.notifications import Group, InboxTx, Notification
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import NewHistoryEntry, RunRecord

EMAIL_OPERATION = "send"
"""The operation of the `smtp` provider an inbox email is sent with."""

EMAIL_PROVIDER = "smtp"
"""The provider an inbox email's connection must use."""


@dataclass(frozen=True)
class Channels:
    """Where one notification goes for one subscriber."""

    in_app: bool = True
    email: bool = True


def channels(rules: Sequence[Any], *, workflow: str | None, feed: str) -> Channels:
    """The channels a subscriber's preference rules give a notification.

    The most specific rule wins: workflow and feed, then workflow, then feed,
    then the defaults (both on). A rule is `{workflow?, feed?, in_app?, email?}`.
    """
    best: tuple[int, Mapping[str, Any]] | None = None
    for rule in rules:
        if not isinstance(rule, Mapping):
            continue
        rule_workflow, rule_feed = rule.get("workflow"), rule.get("feed")
        if rule_workflow is not None and rule_workflow != workflow:
            continue
        if rule_feed is not None and rule_feed != feed:
            continue
        rank = (2 if rule_workflow is not None else 0) + (1 if rule_feed is not None else 0)
        if best is None or rank > best[0]:
            best = (rank, rule)
    if best is None:
        return Channels()
    rule = best[1]
    return Channels(in_app=rule.get("in_app") is not False, email=rule.get("email") is not False)


def notification_id(tenant_id: str, group_id: str, subscriber_id: str) -> str:
    """The id of the notification a NOTIFY step's group gives `subscriber_id`."""
    digest = hashlib.sha256(f"{tenant_id}\n{group_id}\n{subscriber_id}".encode()).hexdigest()
    return f"ntf_{digest[:32]}"


def email_id(tenant_id: str, source: str, subscriber_id: str) -> str:
    """The id of the email `source` (a NOTIFY step's group, or a notification sent
    through the API) gives `subscriber_id`; it is also the email's idempotency key
    (its Message-ID is `<eml_...@ductor>`)."""
    digest = hashlib.sha256(f"{tenant_id}\n{source}\n{subscriber_id}\nemail".encode()).hexdigest()
    return f"eml_{digest[:32]}"


def email_text(title: str, body: str, ctas: Sequence[Mapping[str, Any]]) -> str:
    """The plain-text body of a notification's email: its body (its title when the
    body is empty), then one `label: url` line per link CTA."""
    text = body or title
    links = [f"{c.get('label') or c['url']}: {c['url']}" for c in ctas if c.get("url")]
    return text + ("\n\n" + "\n".join(links) if links else "")


def _one_line(text: str) -> str:
    """`text` as a subject: its runs of whitespace (line breaks too) one space, at
    most 998 characters (RFC 5322's line limit)."""
    return " ".join(text.split())[:998]


def outbox_email(
    *,
    tenant_id: str,
    id: str,
    subscriber_id: str,
    address: str,
    connection: str,
    subject: str,
    title: str,
    body: str,
    ctas: Sequence[Mapping[str, Any]],
    now: datetime,
    notification_id: str | None = None,
    workflow: str | None = None,
    run_id: str | None = None,
    step_ref: str | None = None,
) -> Email:
    """A new outbox row, due now."""
    return Email(
        tenant_id=tenant_id,
        id=id,
        subscriber_id=subscriber_id,
        to_address=address,
        connection=connection,
        subject=_one_line(subject) or _one_line(title),
        text_body=email_text(title, body, ctas),
        notification_id=notification_id,
        workflow=workflow,
        run_id=run_id,
        step_ref=step_ref,
        next_at=now,
        created_at=now,
        updated_at=now,
    )


@dataclass(frozen=True)
class Written:
    """What one `SendNotifications` wrote: the (tenant, subscriber) pairs whose
    feeds moved, the history entry, and how many outbox emails were queued."""

    moved: list[tuple[str, str]]
    entry: NewHistoryEntry
    emails: int


async def write_notifications(
    tx: Tx,
    *,
    run: RunRecord,
    command: SendNotifications,
    now: datetime,
) -> Written:
    """Write the notifications of `command` for `run`, and an outbox email for
    each recipient whose preferences want email and whose profile has an address."""
    inbox = InboxTx(tx)
    tenant = run.tenant_id
    # The recipients' sequence rows are locked in one order before any is written,
    # so two steps notifying the same people in other orders do not deadlock.
    await inbox.lock_subscribers(tenant, command.recipients)
    await inbox.insert_group(
        Group(
            tenant_id=tenant,
            group_id=command.group_id,
            run_id=run.id,
            step_ref=command.step_ref,
            await_action=command.await_action,
        )
    )
    created: list[str] = []
    suppressed: list[str] = []
    email_wanted: list[str] = []
    opted_out: list[str] = []
    moved: list[tuple[str, str]] = []
    for subscriber in command.recipients:
        rules = await inbox.preferences(tenant, subscriber)
        wanted = channels(rules, workflow=run.family_slug, feed=command.feed)
        if command.email is not None:
            (email_wanted if wanted.email else opted_out).append(subscriber)
        if not wanted.in_app:
            suppressed.append(subscriber)
            continue
        [seq] = await inbox.insert(
            [
                Notification(
                    tenant_id=tenant,
                    id=notification_id(tenant, command.group_id, subscriber),
                    subscriber_id=subscriber,
                    feed=command.feed,
                    title=command.title,
                    body=command.body,
                    data=command.data,
                    avatar=command.avatar,
                    ctas=command.ctas,
                    workflow=run.family_slug,
                    run_id=run.id,
                    step_ref=command.step_ref,
                    group_id=command.group_id,
                    created_at=now,
                )
            ],
            now=now,
        )
        if seq:
            created.append(subscriber)
            moved.append((tenant, subscriber))
    data: dict[str, Any] = {
        "step_ref": command.step_ref,
        "group_id": command.group_id,
        "in_app": created,
        "suppressed": suppressed,
    }
    queued = 0
    if command.email is not None:
        connection = str(command.email.get("connection") or "")
        subject = command.email.get("subject")
        addresses = await inbox.emails(tenant, email_wanted)
        rows = [
            outbox_email(
                tenant_id=tenant,
                id=email_id(tenant, command.group_id, subscriber),
                subscriber_id=subscriber,
                address=addresses[subscriber],
                connection=connection,
                subject=subject if isinstance(subject, str) else command.title,
                title=command.title,
                body=command.body,
                ctas=command.ctas,
                now=now,
                notification_id=notification_id(tenant, command.group_id, subscriber)
                if subscriber in created
                else None,
                workflow=run.family_slug,
                run_id=run.id,
                step_ref=command.step_ref,
            )
            for subscriber in email_wanted
            if subscriber in addresses
        ]
        queued = len(await EmailsTx(tx).insert(rows))
        data["email"] = {
            "connection": connection,
            "queued": [row.subscriber_id for row in rows],
            "no_address": [s for s in email_wanted if s not in addresses],
            "opted_out": opted_out,
        }
    entry = NewHistoryEntry(tenant_id=tenant, run_id=run.id, at=now, kind="notify.sent", data=data)
    return Written(moved=moved, entry=entry, emails=queued)


__all__ = [
    "EMAIL_OPERATION",
    "EMAIL_PROVIDER",
    "Channels",
    "Written",
    "channels",
    "email_id",
    "email_text",
    "notification_id",
    "outbox_email",
    "write_notifications",
]
