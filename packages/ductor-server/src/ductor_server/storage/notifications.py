"""SQL for the inbox (migrations 0880, 0890): notifications, their per-subscriber change
log and sequence, subscriber preferences and email addresses, groups and the
tenant's inbox secret.

`InboxTx(tx)` reads and writes these tables through `tx.session`. It keeps the
one invariant the tables carry: every write to a notification takes the
subscriber's next sequence number and appends the notification as it became to
`inbox_changes`, in the same transaction. It decides nothing else (who may see
what, which preferences apply): the inbox service and the engine's effects do.
It lives in storage, as the usage counters do, so that the engine can write
the notifications a tick asks for without importing a service.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from ductor_server.storage.protocol import Row, Session, Tx

_COLS = (
    "tenant_id, id, subscriber_id, feed, title, body, data, avatar, ctas, workflow, run_id,"
    " step_ref, group_id, created_at, seen_at, read_at, archived_at, snoozed_until, acted, seq"
)


class ChangeKind(enum.StrEnum):
    """What happened to a notification."""

    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"


class Notification(msgspec.Struct, frozen=True, kw_only=True):
    """One notification row. `ctas` keeps each CTA as the step resolved it
    (`label`, then `url` or `action`, and `signal`/`event` for an action);
    `acted` is the click that acted on it (`action`, `cta`, `subscriber_id`, `at`)."""

    tenant_id: str
    id: str
    subscriber_id: str
    feed: str
    title: str
    body: str = ""
    data: Any = None
    avatar: str | None = None
    ctas: list[dict[str, Any]] = []
    workflow: str | None = None
    run_id: str | None = None
    step_ref: str | None = None
    group_id: str | None = None
    created_at: datetime
    seen_at: datetime | None = None
    read_at: datetime | None = None
    archived_at: datetime | None = None
    snoozed_until: datetime | None = None
    acted: dict[str, Any] | None = None
    seq: int = 0


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a subscriber's change log: the notification as it became,
    or, for a deletion, as it was when deleted (with the deletion's `seq`)."""

    seq: int
    kind: ChangeKind
    notification_id: str
    notification: Notification | None
    at: datetime


class Group(msgspec.Struct, frozen=True, kw_only=True):
    """The notifications one NOTIFY step created, and the action that answered them."""

    tenant_id: str
    group_id: str
    run_id: str
    step_ref: str
    await_action: bool
    acted: dict[str, Any] | None = None


class FeedCounts(msgspec.Struct, frozen=True, kw_only=True):
    """A feed's live (not archived, not snoozed) notifications."""

    total: int
    unseen: int
    unread: int


def _ts(db: Session, value: Any) -> datetime | None:
    return None if value is None else db.from_timestamp(value)


def _opt(db: Session, value: datetime | None) -> Any:
    return None if value is None else db.to_timestamp(value)


class InboxTx:
    """The inbox tables, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    # --- reading -----------------------------------------------------------------

    def _notification(self, row: Row) -> Notification:
        db = self._db
        return Notification(
            tenant_id=row[0],
            id=row[1],
            subscriber_id=row[2],
            feed=row[3],
            title=row[4],
            body=row[5],
            data=db.from_json(row[6]),
            avatar=row[7],
            ctas=db.from_json(row[8]) or [],
            workflow=row[9],
            run_id=row[10],
            step_ref=row[11],
            group_id=row[12],
            created_at=db.from_timestamp(row[13]),
            seen_at=_ts(db, row[14]),
            read_at=_ts(db, row[15]),
            archived_at=_ts(db, row[16]),
            snoozed_until=_ts(db, row[17]),
            acted=db.from_json(row[18]),
            seq=int(row[19]),
        )

    async def get(self, tenant_id: str, notification_id: str) -> Notification | None:
        """The notification `notification_id` of the tenant, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_COLS} FROM inbox_notifications WHERE tenant_id = %s AND id = %s",
            (tenant_id, notification_id),
        )
        return None if row is None else self._notification(row)

    async def list_notifications(
        self,
        tenant_id: str,
        subscriber_id: str,
        *,
        feed: str | None,
        status: str,
        now: datetime,
        limit: int,
        before: tuple[datetime, str] | None = None,
    ) -> list[Notification]:
        """A subscriber's notifications, newest first, after the cursor `before`
        (the created_at and id of the last one seen).

        `status`: "all" (not archived), "unseen", "unread", "archived" or
        "snoozed"; every status but "snoozed" leaves out notifications snoozed
        until after `now`, and "snoozed" lists only those.
        """
        db = self._db
        where = ["tenant_id = %s", "subscriber_id = %s"]
        params: list[Any] = [tenant_id, subscriber_id]
        if feed is not None:
            where.append("feed = %s")
            params.append(feed)
        if status == "archived":
            where.append("archived_at IS NOT NULL")
        else:
            where.append("archived_at IS NULL")
        if status == "snoozed":
            where.append("snoozed_until IS NOT NULL AND snoozed_until > %s")
            params.append(db.to_timestamp(now))
        else:
            where.append("(snoozed_until IS NULL OR snoozed_until <= %s)")
            params.append(db.to_timestamp(now))
        if status == "unseen":
            where.append("seen_at IS NULL")
        elif status == "unread":
            where.append("read_at IS NULL")
        if before is not None:
            where.append("(created_at < %s OR (created_at = %s AND id < %s))")
            moment = db.to_timestamp(before[0])
            params.extend([moment, moment, before[1]])
        params.append(limit)
        rows = await db.fetch_all(
            f"SELECT {_COLS} FROM inbox_notifications WHERE {' AND '.join(where)}"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            params,
        )
        return [self._notification(row) for row in rows]

    async def counts(
        self, tenant_id: str, subscriber_id: str, *, now: datetime
    ) -> dict[str, FeedCounts]:
        """Per feed, a subscriber's notifications that are neither archived nor snoozed."""
        db = self._db
        rows = await db.fetch_all(
            "SELECT feed, COUNT(*),"
            " SUM(CASE WHEN seen_at IS NULL THEN 1 ELSE 0 END),"
            " SUM(CASE WHEN read_at IS NULL THEN 1 ELSE 0 END)"
            " FROM inbox_notifications WHERE tenant_id = %s AND subscriber_id = %s"
            " AND archived_at IS NULL AND (snoozed_until IS NULL OR snoozed_until <= %s)"
            " GROUP BY feed ORDER BY feed",
            (tenant_id, subscriber_id, db.to_timestamp(now)),
        )
        return {
            row[0]: FeedCounts(total=int(row[1]), unseen=int(row[2] or 0), unread=int(row[3] or 0))
            for row in rows
        }

    async def last_seq(self, tenant_id: str, subscriber_id: str) -> int:
        """The subscriber's latest sequence number (0 before anything happened)."""
        row = await self._db.fetch_one(
            "SELECT last_seq FROM inbox_subscribers WHERE tenant_id = %s AND subscriber_id = %s",
            (tenant_id, subscriber_id),
        )
        return 0 if row is None else int(row[0])

    async def changes_after(
        self, tenant_id: str, subscriber_id: str, after: int, *, limit: int
    ) -> list[Change]:
        """The subscriber's changes with a sequence number above `after`, in order."""
        db = self._db
        rows = await db.fetch_all(
            "SELECT seq, kind, notification_id, notification, at FROM inbox_changes"
            " WHERE tenant_id = %s AND subscriber_id = %s AND seq > %s ORDER BY seq LIMIT %s",
            (tenant_id, subscriber_id, after, limit),
        )
        changes = []
        for row in rows:
            raw = db.from_json(row[3])
            changes.append(
                Change(
                    seq=int(row[0]),
                    kind=ChangeKind(row[1]),
                    notification_id=row[2],
                    notification=None if raw is None else msgspec.convert(raw, Notification),
                    at=db.from_timestamp(row[4]),
                )
            )
        return changes

    async def ids_where(
        self,
        tenant_id: str,
        subscriber_id: str,
        *,
        feed: str | None,
        now: datetime,
        unseen: bool = False,
        unread: bool = False,
        read: bool = False,
        limit: int,
    ) -> list[str]:
        """Ids of a subscriber's live (neither archived nor snoozed past `now`)
        notifications matching the filters, oldest first, for a bulk action."""
        where = [
            "tenant_id = %s",
            "subscriber_id = %s",
            "archived_at IS NULL",
            "(snoozed_until IS NULL OR snoozed_until <= %s)",
        ]
        params: list[Any] = [tenant_id, subscriber_id, self._db.to_timestamp(now)]
        if feed is not None:
            where.append("feed = %s")
            params.append(feed)
        if unseen:
            where.append("seen_at IS NULL")
        if unread:
            where.append("read_at IS NULL")
        if read:
            where.append("read_at IS NOT NULL")
        params.append(limit)
        rows = await self._db.fetch_all(
            f"SELECT id FROM inbox_notifications WHERE {' AND '.join(where)}"
            " ORDER BY created_at, id LIMIT %s",
            params,
        )
        return [row[0] for row in rows]

    async def due_snoozes(self, now: datetime, *, limit: int) -> list[tuple[str, str]]:
        """(tenant, id) of notifications whose snooze ended by `now`, every tenant's."""
        rows = await self._db.fetch_all(
            "SELECT tenant_id, id FROM inbox_notifications"
            " WHERE snoozed_until IS NOT NULL AND snoozed_until <= %s"
            " ORDER BY snoozed_until LIMIT %s",
            (self._db.to_timestamp(now), limit),
        )
        return [(row[0], row[1]) for row in rows]

    async def next_snooze_at(self) -> datetime | None:
        """When the next snooze ends, every tenant's; None if nothing is snoozed."""
        row = await self._db.fetch_one(
            "SELECT MIN(snoozed_until) FROM inbox_notifications WHERE snoozed_until IS NOT NULL",
        )
        return None if row is None or row[0] is None else self._db.from_timestamp(row[0])

    # --- sequence and change log -------------------------------------------------------

    async def take_seqs(self, tenant_id: str, subscriber_id: str, count: int) -> int:
        """Reserve the subscriber's next `count` sequence numbers; return the first.

        The subscriber's row stays locked until the transaction ends, so one
        subscriber's changes commit in the order of their numbers.
        """
        row = await self._db.fetch_one(
            "INSERT INTO inbox_subscribers (tenant_id, subscriber_id, last_seq)"
            " VALUES (%s, %s, %s) ON CONFLICT (tenant_id, subscriber_id)"
            " DO UPDATE SET last_seq = inbox_subscribers.last_seq + excluded.last_seq"
            " RETURNING last_seq",
            (tenant_id, subscriber_id, count),
        )
        assert row is not None
        return int(row[0]) - count + 1

    async def lock_subscribers(self, tenant_id: str, subscriber_ids: Sequence[str]) -> None:
        """Lock the sequence rows of `subscriber_ids` (made if missing) until the
        transaction ends, in one order: sorted. A writer that changes several
        subscribers' feeds takes their locks this way first, so two such writers
        wait for each other instead of deadlocking."""
        ids = sorted(set(subscriber_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            await self._db.execute(
                "INSERT INTO inbox_subscribers (tenant_id, subscriber_id, last_seq) VALUES "
                + ", ".join(["(%s, %s, 0)"] * len(chunk))
                + " ON CONFLICT (tenant_id, subscriber_id)"
                " DO UPDATE SET last_seq = inbox_subscribers.last_seq",
                [value for subscriber in chunk for value in (tenant_id, subscriber)],
            )

    async def _log(self, changes: Sequence[tuple[str, Change]]) -> None:
        db = self._db
        await db.executemany(
            "INSERT INTO inbox_changes"
            " (tenant_id, subscriber_id, seq, kind, notification_id, notification, at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    tenant_id,
                    _subscriber_of(change, tenant_id),
                    change.seq,
                    change.kind.value,
                    change.notification_id,
                    db.to_json(
                        None
                        if change.notification is None
                        else msgspec.to_builtins(change.notification)
                    ),
                    db.to_timestamp(change.at),
                )
                for tenant_id, change in changes
            ],
        )

    # --- writing -----------------------------------------------------------------------

    async def insert(self, notifications: Sequence[Notification], *, now: datetime) -> list[int]:
        """Write new notifications (each takes its subscriber's next sequence number)
        and log them; return their sequence numbers. An id already taken is
        skipped (a repeated send) and gives 0."""
        db = self._db
        seqs: list[int] = []
        logged: list[tuple[str, Change]] = []
        for item in notifications:
            taken = await db.fetch_one(
                "SELECT 1 FROM inbox_notifications WHERE tenant_id = %s AND id = %s",
                (item.tenant_id, item.id),
            )
            if taken is not None:
                seqs.append(0)
                continue
            seq = await self.take_seqs(item.tenant_id, item.subscriber_id, 1)
            stored = msgspec.structs.replace(item, seq=seq)
            await db.execute(
                f"INSERT INTO inbox_notifications ({_COLS}) VALUES"
                " (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                self._params(stored),
            )
            seqs.append(seq)
            logged.append(
                (
                    item.tenant_id,
                    Change(
                        seq=seq,
                        kind=ChangeKind.CREATED,
                        notification_id=item.id,
                        notification=stored,
                        at=now,
                    ),
                )
            )
        if logged:
            await self._log(logged)
        return seqs

    def _params(self, n: Notification) -> tuple[Any, ...]:
        db = self._db
        return (
            n.tenant_id,
            n.id,
            n.subscriber_id,
            n.feed,
            n.title,
            n.body,
            db.to_json(n.data),
            n.avatar,
            db.to_json(n.ctas),
            n.workflow,
            n.run_id,
            n.step_ref,
            n.group_id,
            db.to_timestamp(n.created_at),
            _opt(db, n.seen_at),
            _opt(db, n.read_at),
            _opt(db, n.archived_at),
            _opt(db, n.snoozed_until),
            db.to_json(n.acted),
            n.seq,
        )

    async def update(self, changed: Notification, *, now: datetime) -> Notification:
        """Store the new state of an existing notification under the subscriber's
        next sequence number and log it; return it as stored."""
        db = self._db
        seq = await self.take_seqs(changed.tenant_id, changed.subscriber_id, 1)
        stored = msgspec.structs.replace(changed, seq=seq)
        await db.execute(
            "UPDATE inbox_notifications SET seen_at = %s, read_at = %s, archived_at = %s,"
            " snoozed_until = %s, acted = %s, seq = %s WHERE tenant_id = %s AND id = %s",
            (
                _opt(db, stored.seen_at),
                _opt(db, stored.read_at),
                _opt(db, stored.archived_at),
                _opt(db, stored.snoozed_until),
                db.to_json(stored.acted),
                seq,
                stored.tenant_id,
                stored.id,
            ),
        )
        change = Change(
            seq=seq,
            kind=ChangeKind.UPDATED,
            notification_id=stored.id,
            notification=stored,
            at=now,
        )
        await self._log([(stored.tenant_id, change)])
        return stored

    async def delete(self, notification: Notification, *, now: datetime) -> int:
        """Delete a notification and log the deletion; return its sequence number."""
        seq = await self.take_seqs(notification.tenant_id, notification.subscriber_id, 1)
        await self._db.execute(
            "DELETE FROM inbox_notifications WHERE tenant_id = %s AND id = %s",
            (notification.tenant_id, notification.id),
        )
        change = Change(
            seq=seq,
            kind=ChangeKind.DELETED,
            notification_id=notification.id,
            notification=msgspec.structs.replace(notification, seq=seq),
            at=now,
        )
        await self._log([(notification.tenant_id, change)])
        return seq

    # --- groups ----------------------------------------------------------------------------

    async def insert_group(self, group: Group) -> bool:
        """Record a NOTIFY step's group; False (nothing written) if it exists."""
        count = await self._db.execute(
            "INSERT INTO inbox_groups (tenant_id, group_id, run_id, step_ref, await_action, acted)"
            " VALUES (%s, %s, %s, %s, %s, NULL) ON CONFLICT DO NOTHING",
            (group.tenant_id, group.group_id, group.run_id, group.step_ref, group.await_action),
        )
        return count > 0

    async def get_group(self, tenant_id: str, group_id: str) -> Group | None:
        """The group `group_id` of the tenant, or None."""
        row = await self._db.fetch_one(
            "SELECT tenant_id, group_id, run_id, step_ref, await_action, acted FROM inbox_groups"
            " WHERE tenant_id = %s AND group_id = %s",
            (tenant_id, group_id),
        )
        if row is None:
            return None
        return Group(
            tenant_id=row[0],
            group_id=row[1],
            run_id=row[2],
            step_ref=row[3],
            await_action=bool(row[4]),
            acted=self._db.from_json(row[5]),
        )

    async def act_on_group(self, tenant_id: str, group_id: str, acted: dict[str, Any]) -> bool:
        """Record the group's answer if it has none yet; True if this call recorded it."""
        count = await self._db.execute(
            "UPDATE inbox_groups SET acted = %s"
            " WHERE tenant_id = %s AND group_id = %s AND acted IS NULL",
            (self._db.to_json(acted), tenant_id, group_id),
        )
        return count > 0

    # --- preferences and the secret ----------------------------------------------------------

    async def preferences(self, tenant_id: str, subscriber_id: str) -> list[Any]:
        """The subscriber's preference rules as stored (a JSON list; empty if none)."""
        row = await self._db.fetch_one(
            "SELECT preferences FROM inbox_subscribers WHERE tenant_id = %s AND subscriber_id = %s",
            (tenant_id, subscriber_id),
        )
        value = None if row is None else self._db.from_json(row[0])
        return value if isinstance(value, list) else []

    async def set_preferences(self, tenant_id: str, subscriber_id: str, rules: list[Any]) -> None:
        """Replace the subscriber's preference rules."""
        await self._db.execute(
            "INSERT INTO inbox_subscribers (tenant_id, subscriber_id, last_seq, preferences)"
            " VALUES (%s, %s, 0, %s) ON CONFLICT (tenant_id, subscriber_id)"
            " DO UPDATE SET preferences = excluded.preferences",
            (tenant_id, subscriber_id, self._db.to_json(rules)),
        )

    async def emails(self, tenant_id: str, subscriber_ids: Sequence[str]) -> dict[str, str]:
        """The email addresses of those of `subscriber_ids` whose profile has one."""
        found: dict[str, str] = {}
        ids = list(dict.fromkeys(subscriber_ids))
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ", ".join(["%s"] * len(chunk))
            rows = await self._db.fetch_all(
                "SELECT subscriber_id, email FROM inbox_subscribers WHERE tenant_id = %s"
                f" AND subscriber_id IN ({marks}) AND email IS NOT NULL",
                (tenant_id, *chunk),
            )
            found.update({row[0]: row[1] for row in rows})
        return found

    async def set_email(self, tenant_id: str, subscriber_id: str, email: str | None) -> None:
        """Set (or with None, clear) the subscriber's email address."""
        await self._db.execute(
            "INSERT INTO inbox_subscribers (tenant_id, subscriber_id, last_seq, email)"
            " VALUES (%s, %s, 0, %s) ON CONFLICT (tenant_id, subscriber_id)"
            " DO UPDATE SET email = excluded.email",
            (tenant_id, subscriber_id, email),
        )

    async def secret(self, tenant_id: str) -> str | None:
        """The tenant's inbox secret, or None if it has none yet."""
        row = await self._db.fetch_one(
            "SELECT secret FROM inbox_secrets WHERE tenant_id = %s", (tenant_id,)
        )
        return None if row is None else str(row[0])

    async def put_secret(self, tenant_id: str, secret: str, *, now: datetime, replace: bool) -> str:
        """Store `secret` (replacing the current one only if `replace`); return the
        secret in force afterwards."""
        conflict = (
            "DO UPDATE SET secret = excluded.secret, rotated_at = excluded.rotated_at"
            if replace
            else "DO NOTHING"
        )
        await self._db.execute(
            "INSERT INTO inbox_secrets (tenant_id, secret, rotated_at) VALUES (%s, %s, %s)"
            f" ON CONFLICT (tenant_id) {conflict}",
            (tenant_id, secret, self._db.to_timestamp(now)),
        )
        current = await self.secret(tenant_id)
        assert current is not None
        return current


def _subscriber_of(change: Change, tenant_id: str) -> str:
    """The subscriber a logged change belongs to."""
    assert change.notification is not None, f"a change of tenant {tenant_id} names nobody"
    return change.notification.subscriber_id


__all__ = [
    "Change",
    "ChangeKind",
    "FeedCounts",
    "Group",
    "InboxTx",
    "Notification",
]
