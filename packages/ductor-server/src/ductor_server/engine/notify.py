"""Writing the notifications a NOTIFY step's tick asked for (`SendNotifications`),
in the transaction that commits the tick, and the preference rules that decide
who gets them in the inbox and by email.

Nothing here reads the clock or talks to the network. Email is not sent yet
(it needs a subscriber's address and an outbox a worker sends through an SMTP
connection): a recipient whose preferences want email gets a history note saying
so (`notify.sent`, `email.sent` false). The notification id is a hash of the
tenant, the step's group and the subscriber, so a repeated command writes nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ductor_core.runs import SendNotifications
from ductor_server.storage.notifications import Group, InboxTx, Notification
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import NewHistoryEntry, RunRecord

EMAIL_NOTE = (
    "email is not sent: the inbox does not send email through SMTP connections yet; "
    "the notification was delivered in-app only"
)
"""The note recorded for recipients whose preferences want email."""


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


async def write_notifications(
    tx: Tx,
    *,
    run: RunRecord,
    command: SendNotifications,
    now: datetime,
) -> tuple[list[tuple[str, str]], NewHistoryEntry]:
    """Write the notifications of `command` for `run`; return the (tenant,
    subscriber) pairs whose feeds moved and the history entry saying what was sent."""
    inbox = InboxTx(tx)
    tenant = run.tenant_id
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
    email: list[str] = []
    moved: list[tuple[str, str]] = []
    for subscriber in command.recipients:
        rules = await inbox.preferences(tenant, subscriber)
        wanted = channels(rules, workflow=run.family_slug, feed=command.feed)
        if wanted.email and command.email is not None:
            email.append(subscriber)
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
    if command.email is not None:
        data["email"] = {
            "connection": command.email.get("connection"),
            "recipients": email,
            "sent": False,
            "note": EMAIL_NOTE,
        }
    entry = NewHistoryEntry(tenant_id=tenant, run_id=run.id, at=now, kind="notify.sent", data=data)
    return moved, entry


__all__ = ["EMAIL_NOTE", "Channels", "channels", "notification_id", "write_notifications"]
