"""The inbox service: notifications per tenant and subscriber, as the tenant (API
key) and as the subscriber's own client (a subscriber token) see them.

A subscriber token is the hex HMAC-SHA256 of the subscriber id under the
tenant's inbox secret; wrong credentials, like another subscriber's
notification, are `inbox.not_found` / `notification.not_found` (404), never a
hint that something exists. Every change goes through `InboxTx`, which gives it
the subscriber's next sequence number and logs it, and is announced on the
`InboxFeed` after its commit. Transport-neutral: nothing here knows HTTP.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec

from ductor_core.builtin_steps import NAME_PATTERN
from ductor_core.durations import parse_duration
from ductor_core.errors import DurationError
from ductor_core.notification_fields import (
    DATA_RULE,
    LABEL_RULE,
    MAX_TEXT,
    SUBSCRIBER_ID_RULE,
    URL_RULE,
    is_data,
    is_label,
    is_link,
    is_subscriber_id,
)
from ductor_core.runs import SignalReceived
from ductor_core.tick import notify_signal
from ductor_core.timestamps import utc_text
from ductor_core.validation import SLUG_PATTERN
from ductor_server.engine.inboxfeed import InboxFeed, LocalInboxFeed
from ductor_server.engine.notify import channels
from ductor_server.engine.queue import Topic
from ductor_server.errors import (
    InboxNotFound,
    NotificationNotActionable,
    NotificationNotFound,
    RequestInvalid,
)
from ductor_server.services.context import ServiceContext
from ductor_server.services.cursors import parse_time_cursor, time_cursor
from ductor_server.services.events import EventsService
from ductor_server.services.idempotency import Answer, Claim, Outcome, once
from ductor_server.services.inbox_email import (
    EmailOption,
    InboxEmail,
    SubscriberBody,
    SubscriberView,
    check_email_option,
    queue_api_email,
    require_email_connection,
)
from ductor_server.services.json_limits import INT64_MAX
from ductor_server.storage.notifications import (
    Change,
    FeedCounts,
    InboxTx,
    Notification,
)
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import NewInboxItem

MAX_PAGE = 200
"""The most notifications or changes one read returns."""

MAX_BULK = 1000
"""The most notifications one bulk action changes (`more` says when to call again)."""

MAX_RULES = 100
"""The most preference rules a subscriber keeps."""

MAX_SNOOZE = timedelta(days=365)
"""The longest snooze."""

STATUSES = ("all", "unseen", "unread", "archived", "snoozed")
"""The `status` filters of a notification list."""


# --- wire types -------------------------------------------------------------------------


class Cta(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A call to action as a client shows it: a link (`url`) or an `action`."""

    label: str
    url: str | None = None
    action: str | None = None


class NotificationView(msgspec.Struct, frozen=True, kw_only=True):
    """A notification as its subscriber (and the tenant) sees it."""

    id: str
    subscriber_id: str
    feed: str
    title: str
    body: str
    data: Any
    avatar: str | None
    ctas: list[Cta]
    workflow: str | None
    run_id: str | None
    created_at: datetime
    seen: bool
    read: bool
    archived: bool
    seen_at: datetime | None
    read_at: datetime | None
    archived_at: datetime | None
    snoozed_until: datetime | None
    acted: dict[str, Any] | None
    seq: int


class NotificationPage(msgspec.Struct, frozen=True, kw_only=True):
    """Notifications newest first; pass `next_cursor` as `cursor` for the next page."""

    notifications: list[NotificationView]
    next_cursor: str | None = None


class ChangeView(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a subscriber's inbox: the notification as it became."""

    seq: int
    kind: str
    notification: NotificationView


class ChangesPage(msgspec.Struct, frozen=True, kw_only=True):
    """Changes after a cursor, in sequence order; `cursor` is the last one's
    sequence number (the one asked for if none), `more` whether others follow."""

    changes: list[ChangeView]
    cursor: int
    more: bool


class Counts(msgspec.Struct, frozen=True, kw_only=True):
    """Live (not archived, not snoozed) notifications: all, unseen, unread."""

    total: int
    unseen: int
    unread: int


class CountsView(msgspec.Struct, frozen=True, kw_only=True):
    """A subscriber's counts per feed and over every feed, as of sequence `seq`."""

    feeds: dict[str, Counts]
    all: Counts
    seq: int


class CtaBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A CTA of a notification the tenant sends: a link or an action name."""

    label: str
    url: str | None = None
    action: str | None = None


class SendBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/inbox/notifications`: a notification for one subscriber."""

    subscriber_id: str
    title: str
    body: str = ""
    data: dict[str, Any] | None = None
    feed: str = "default"
    avatar: str | None = None
    ctas: list[CtaBody] = []
    email: EmailOption | None = None


class SendResult(msgspec.Struct, frozen=True, kw_only=True):
    """What a send did: the notification, or none when the subscriber's preferences
    turn the in-app channel off (`suppressed`); `email` (with an `email` option)
    says whether an email was queued: `{"queued": true, "id", "to"}` or
    `{"queued": false, "reason": "opted_out" | "no_address"}`."""

    notification: NotificationView | None
    suppressed: bool = False
    email: dict[str, Any] | None = None


class StateBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PATCH` a notification: mark it seen, read or archived (or undo that), or
    snooze it for `snooze` ("2h") or until `snoozed_until`; `unsnooze: true`
    ends a snooze now."""

    seen: bool | None = None
    read: bool | None = None
    archived: bool | None = None
    snooze: str | None = None
    snoozed_until: datetime | None = None
    unsnooze: bool = False


class BulkBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A bulk action over a subscriber's live notifications, in one feed or all."""

    action: Literal["seen", "read", "archive_read", "archive"]
    feed: str | None = None


class BulkResult(msgspec.Struct, frozen=True, kw_only=True):
    """How many notifications a bulk action changed; `more`: call it again."""

    changed: int
    more: bool


class PreferenceRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Channels for the notifications of one workflow, one feed, or both (the most
    specific rule wins; with no rule both channels are on)."""

    workflow: str | None = None
    feed: str | None = None
    in_app: bool = True
    email: bool = True


class Preferences(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A subscriber's preference rules."""

    rules: list[PreferenceRule] = []


class SecretView(msgspec.Struct, frozen=True, kw_only=True):
    """The tenant's inbox secret: subscriber tokens are HMAC-SHA256 under it."""

    secret: str


class ClickResult(msgspec.Struct, frozen=True, kw_only=True):
    """A clicked action: the notification after it; `resumed` when this click
    answered the step that sent it; `duplicate` when it had been acted on already."""

    notification: NotificationView
    action: str
    resumed: bool
    duplicate: bool


# --- helpers -----------------------------------------------------------------------------


def subscriber_token(secret: str, subscriber_id: str) -> str:
    """The token a subscriber's client presents: hex HMAC-SHA256 of the id under `secret`."""
    return hmac.new(secret.encode(), subscriber_id.encode(), hashlib.sha256).hexdigest()


def view(n: Notification) -> NotificationView:
    """The client's view of a stored notification (CTAs without their signal/event)."""
    return NotificationView(
        id=n.id,
        subscriber_id=n.subscriber_id,
        feed=n.feed,
        title=n.title,
        body=n.body,
        data=n.data,
        avatar=n.avatar,
        ctas=[
            Cta(label=str(c.get("label", "")), url=c.get("url"), action=c.get("action"))
            for c in n.ctas
        ],
        workflow=n.workflow,
        run_id=n.run_id,
        created_at=n.created_at,
        seen=n.seen_at is not None,
        read=n.read_at is not None,
        archived=n.archived_at is not None,
        seen_at=n.seen_at,
        read_at=n.read_at,
        archived_at=n.archived_at,
        snoozed_until=n.snoozed_until,
        acted=n.acted,
        seq=n.seq,
    )


def change_view(change: Change) -> ChangeView:
    """A logged change as clients receive it."""
    assert change.notification is not None
    notification = msgspec.structs.replace(change.notification, seq=change.seq)
    return ChangeView(seq=change.seq, kind=change.kind.value, notification=view(notification))


def _check_id(what: str, value: str, pointer: str) -> str:
    if not is_subscriber_id(value):
        raise RequestInvalid(f"{what} {SUBSCRIBER_ID_RULE}", details={"pointer": pointer})
    return value


def _check_name(what: str, value: str, pointer: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise RequestInvalid(
            f"{what} must be 1-64 letters, digits or _.:-, got {value!r:.80}",
            details={"pointer": pointer},
        )
    return value


def _check_link(what: str, value: str, pointer: str) -> str:
    if not is_link(value):
        raise RequestInvalid(f"{what} {URL_RULE}, got {value!r:.80}", details={"pointer": pointer})
    return value


def _cursor(n: Notification) -> str:
    return time_cursor(n.created_at, n.id)


def _sum(counts: dict[str, FeedCounts]) -> Counts:
    return Counts(
        total=sum(c.total for c in counts.values()),
        unseen=sum(c.unseen for c in counts.values()),
        unread=sum(c.unread for c in counts.values()),
    )


# --- the service -------------------------------------------------------------------------


class InboxService:
    """Notifications, their states, counts, change log, preferences and the secret."""

    def __init__(self, context: ServiceContext, events: EventsService) -> None:
        self._context = context
        self._events = events
        self.email = InboxEmail(context.store, max_page=MAX_PAGE)

    @property
    def feed(self) -> InboxFeed:
        """Where changes are announced (and sessions listen)."""
        feed = self._context.feed
        return feed if feed is not None else LocalInboxFeed()

    def _now(self) -> datetime:
        return self._context.clock.now()

    # --- the secret and subscriber credentials ---------------------------------------

    async def secret(self, tenant_id: str) -> SecretView:
        """The tenant's inbox secret, made on first use."""
        now = self._now()
        async with self._context.store.transaction() as tx:
            current = await InboxTx(tx).put_secret(
                tenant_id, secrets.token_urlsafe(32), now=now, replace=False
            )
        return SecretView(secret=current)

    async def rotate_secret(self, tenant_id: str) -> SecretView:
        """Replace the tenant's inbox secret: every subscriber token changes at once."""
        now = self._now()
        async with self._context.store.transaction() as tx:
            current = await InboxTx(tx).put_secret(
                tenant_id, secrets.token_urlsafe(32), now=now, replace=True
            )
        return SecretView(secret=current)

    async def authenticate(self, tenant_id: str, subscriber_id: str, token: str) -> None:
        """Check a subscriber's credentials.

        Raises:
            InboxNotFound: the tenant has no inbox secret or the token does not match.
        """
        # Whatever the caller sent is only compared, never an error of its own: a
        # token is hex (a non-ASCII one cannot match), a subscriber id follows its
        # rule, and a tenant id with a NUL (which a store may not take) has no inbox.
        if (
            not tenant_id
            or "\x00" in tenant_id
            or not is_subscriber_id(subscriber_id)
            or not token
            or not token.isascii()
        ):
            raise InboxNotFound()
        async with self._context.store.transaction() as tx:
            secret = await InboxTx(tx).secret(tenant_id)
        if secret is None:
            raise InboxNotFound()
        if not hmac.compare_digest(subscriber_token(secret, subscriber_id), token.lower()):
            raise InboxNotFound()

    # --- the tenant's calls ----------------------------------------------------------------

    async def send(
        self, tenant_id: str, body: SendBody, *, idempotency_key: str | None = None
    ) -> Answer[SendResult]:
        """Create a notification for one subscriber (as the preferences allow); `CREATED`.

        Raises:
            RequestInvalid: a field is out of bounds (details.pointer names it).
            IdempotencyConflict: the key was used with another body.
        """
        _check_id("subscriber_id", body.subscriber_id, "/subscriber_id")
        _check_name("feed", body.feed, "/feed")
        if len(body.title) > MAX_TEXT or len(body.body) > MAX_TEXT:
            raise RequestInvalid(
                f"title and body are at most {MAX_TEXT} characters",
                details={"pointer": "/title" if len(body.title) > MAX_TEXT else "/body"},
            )
        if body.data is not None and not is_data(body.data):
            raise RequestInvalid(f"data {DATA_RULE}", details={"pointer": "/data"})
        if body.avatar is not None:
            _check_link("avatar", body.avatar, "/avatar")
        if len(body.ctas) > 2:
            raise RequestInvalid("a notification has at most 2 CTAs", details={"pointer": "/ctas"})
        for index, cta in enumerate(body.ctas):
            if not is_label(cta.label):
                raise RequestInvalid(
                    f"a CTA's label {LABEL_RULE}, got {cta.label!r:.80}",
                    details={"pointer": f"/ctas/{index}/label"},
                )
            if (cta.url is None) == (cta.action is None):
                raise RequestInvalid(
                    "a CTA needs exactly one of 'url' or 'action'",
                    details={"pointer": f"/ctas/{index}"},
                )
            if cta.url is not None:
                _check_link("a CTA's url", cta.url, f"/ctas/{index}/url")
            if cta.action is not None:
                _check_name("action", cta.action, f"/ctas/{index}/action")
        if body.email is not None:
            check_email_option(body.email)
        now = self._now()
        claim = Claim.of(tenant_id, "inbox.send", idempotency_key, body, now=now)
        # A new id every time: a repeat within the key's retention gets the first
        # answer from the claim, and a key used again after it is a new send (an id
        # made from the key would name the notification it sent the first time).
        notification_id = f"ntf_{uuid.uuid4().hex}"
        moved: list[tuple[str, str]] = []
        queued: list[bool] = []

        async def effect(tx: Tx) -> Answer[SendResult]:
            inbox = InboxTx(tx)
            rules = await inbox.preferences(tenant_id, body.subscriber_id)
            wanted = channels(rules, workflow=None, feed=body.feed)
            email: dict[str, Any] | None = None
            if body.email is not None:
                await require_email_connection(tx, tenant_id, body.email.connection)
                email = {"queued": False, "reason": "opted_out"}
                if wanted.email:
                    email = await queue_api_email(
                        tx,
                        tenant_id=tenant_id,
                        subscriber_id=body.subscriber_id,
                        option=body.email,
                        source=notification_id,
                        title=body.title,
                        body=body.body,
                        ctas=[msgspec.to_builtins(c) for c in body.ctas],
                        notification_id=notification_id if wanted.in_app else None,
                        now=now,
                    )
                    if email.get("queued"):
                        queued.append(True)
            if not wanted.in_app:
                return Answer(
                    SendResult(notification=None, suppressed=True, email=email), Outcome.OK
                )
            item = Notification(
                tenant_id=tenant_id,
                id=notification_id,
                subscriber_id=body.subscriber_id,
                feed=body.feed,
                title=body.title,
                body=body.body,
                data=body.data,
                avatar=body.avatar,
                ctas=[msgspec.to_builtins(c) for c in body.ctas],
                created_at=now,
            )
            [seq] = await inbox.insert([item], now=now)
            moved.append((tenant_id, body.subscriber_id))
            stored = msgspec.structs.replace(item, seq=seq)
            return Answer(SendResult(notification=view(stored), email=email), Outcome.CREATED)

        answer = await once(self._context.store, claim, SendResult, effect)
        self.feed.announce(moved)
        if queued:
            self._context.wake.notify(Topic.EMAIL)
        return answer

    async def list_notifications(
        self,
        tenant_id: str,
        subscriber_id: str,
        *,
        feed: str | None = None,
        status: str = "all",
        cursor: str | None = None,
        limit: int = 50,
    ) -> NotificationPage:
        """A subscriber's notifications, newest first; an empty `feed`, `status` or
        `cursor` is the same as none.

        Raises:
            RequestInvalid: a subscriber id or feed that is not one, unknown
                status, bad cursor or limit.
        """
        _check_id("subscriber_id", subscriber_id, "subscriber_id")
        feed = _check_name("feed", feed, "feed") if feed else None
        status = status or "all"
        if status not in STATUSES:
            raise RequestInvalid(
                f"status must be one of {', '.join(STATUSES)}", details={"pointer": "status"}
            )
        if not 1 <= limit <= MAX_PAGE:
            raise RequestInvalid(f"limit is 1 to {MAX_PAGE}", details={"pointer": "limit"})
        before = parse_time_cursor(cursor) if cursor else None
        async with self._context.store.transaction() as tx:
            items = await InboxTx(tx).list_notifications(
                tenant_id,
                subscriber_id,
                feed=feed,
                status=status,
                now=self._now(),
                limit=limit + 1,
                before=before,
            )
        more = len(items) > limit
        items = items[:limit]
        return NotificationPage(
            notifications=[view(n) for n in items],
            next_cursor=_cursor(items[-1]) if more and items else None,
        )

    async def get(
        self, tenant_id: str, notification_id: str, *, subscriber_id: str | None = None
    ) -> NotificationView:
        """One notification (of `subscriber_id` when given).

        Raises:
            NotificationNotFound: no such notification for this tenant (and subscriber).
        """
        async with self._context.store.transaction() as tx:
            item = await self._find(InboxTx(tx), tenant_id, notification_id, subscriber_id)
        return view(item)

    async def delete(self, tenant_id: str, notification_id: str) -> None:
        """Delete a notification; its subscriber's sessions get a `deleted` change.

        Raises:
            NotificationNotFound: no such notification for this tenant.
        """
        now = self._now()
        async with self._context.store.transaction() as tx:
            inbox = InboxTx(tx)
            item = await self._find(inbox, tenant_id, notification_id, None)
            await inbox.take_seqs(tenant_id, item.subscriber_id, 0)  # lock, then re-read
            item = await self._find(inbox, tenant_id, notification_id, None)
            await inbox.delete(item, now=now)
        self.feed.announce([(tenant_id, item.subscriber_id)])

    async def subscriber(self, tenant_id: str, subscriber_id: str) -> SubscriberView:
        """A subscriber's profile (its email address, or null)."""
        _check_id("subscriber id", subscriber_id, "subscriber_id")
        return await self.email.subscriber(tenant_id, subscriber_id)

    async def set_subscriber(
        self, tenant_id: str, subscriber_id: str, body: SubscriberBody
    ) -> SubscriberView:
        """Set a subscriber's profile (its email address; null removes it).

        Raises:
            RequestInvalid: a bad subscriber id or address.
        """
        _check_id("subscriber id", subscriber_id, "subscriber_id")
        return await self.email.set_subscriber(tenant_id, subscriber_id, body)

    async def preferences(self, tenant_id: str, subscriber_id: str) -> Preferences:
        """A subscriber's preference rules."""
        _check_id("subscriber id", subscriber_id, "subscriber_id")
        async with self._context.store.transaction() as tx:
            raw = await InboxTx(tx).preferences(tenant_id, subscriber_id)
        return msgspec.convert({"rules": raw}, Preferences)

    async def set_preferences(
        self, tenant_id: str, subscriber_id: str, preferences: Preferences
    ) -> Preferences:
        """Replace a subscriber's preference rules.

        Raises:
            RequestInvalid: too many rules, a rule that names neither workflow nor
                feed, a bad workflow slug or feed name, or two rules for the same
                workflow and feed.
        """
        _check_id("subscriber id", subscriber_id, "subscriber_id")
        if len(preferences.rules) > MAX_RULES:
            raise RequestInvalid(
                f"at most {MAX_RULES} preference rules", details={"pointer": "/rules"}
            )
        seen: dict[tuple[str | None, str | None], int] = {}
        for index, rule in enumerate(preferences.rules):
            if rule.workflow is None and rule.feed is None:
                raise RequestInvalid(
                    "a rule names a workflow, a feed or both",
                    details={"pointer": f"/rules/{index}"},
                )
            if rule.workflow is not None and not SLUG_PATTERN.fullmatch(rule.workflow):
                raise RequestInvalid(
                    "workflow must be a workflow's family_slug (1-63 lowercase letters,"
                    f" digits or -, starting with a letter or digit), got {rule.workflow!r:.80}",
                    details={"pointer": f"/rules/{index}/workflow"},
                )
            if rule.feed is not None:
                _check_name("feed", rule.feed, f"/rules/{index}/feed")
            earlier = seen.setdefault((rule.workflow, rule.feed), index)
            if earlier != index:
                raise RequestInvalid(
                    f"rules {earlier} and {index} name the same workflow and feed;"
                    " keep one rule for each",
                    details={"pointer": f"/rules/{index}"},
                )
        async with self._context.store.transaction() as tx:
            await InboxTx(tx).set_preferences(
                tenant_id, subscriber_id, msgspec.to_builtins(preferences.rules)
            )
        return preferences

    # --- the subscriber's calls ------------------------------------------------------------

    async def set_state(
        self, tenant_id: str, subscriber_id: str, notification_id: str, body: StateBody
    ) -> NotificationView:
        """Change a notification's seen, read, archived or snoozed state.

        Raises:
            NotificationNotFound: not this subscriber's notification.
            RequestInvalid: a snooze in the past, too long, both forms at once, or
                a snooze with `unsnooze`.
        """
        now = self._now()
        until = self._snooze_until(body, now)
        async with self._context.store.transaction() as tx:
            inbox = InboxTx(tx)
            await inbox.take_seqs(tenant_id, subscriber_id, 0)  # one writer per subscriber
            item = await self._find(inbox, tenant_id, notification_id, subscriber_id)
            changed = _apply_state(item, body, until, now)
            if changed != item:
                item = await inbox.update(changed, now=now)
        if until is not None:
            self._context.wake.notify(Topic.TIMERS)  # the timer loop re-plans its sleep
        self.feed.announce([(tenant_id, subscriber_id)])
        return view(item)

    def _snooze_until(self, body: StateBody, now: datetime) -> datetime | None:
        if body.snooze is not None and body.snoozed_until is not None:
            raise RequestInvalid(
                "give 'snooze' or 'snoozed_until', not both", details={"pointer": "/snooze"}
            )
        if body.unsnooze and (body.snooze is not None or body.snoozed_until is not None):
            raise RequestInvalid(
                "'unsnooze' ends a snooze: give it without 'snooze' or 'snoozed_until'",
                details={"pointer": "/unsnooze"},
            )
        until = body.snoozed_until
        if body.snooze is not None:
            try:
                until = now + parse_duration(body.snooze)
            except DurationError as exc:
                raise RequestInvalid(exc.message, details={"pointer": "/snooze"}) from exc
        if until is None:
            return None
        if until.tzinfo is None:
            raise RequestInvalid(
                "snoozed_until needs a time zone", details={"pointer": "/snoozed_until"}
            )
        if until <= now or until - now > MAX_SNOOZE:
            raise RequestInvalid(
                f"a snooze ends in the future, at most {MAX_SNOOZE.days} days away",
                details={"pointer": "/snooze" if body.snooze else "/snoozed_until"},
            )
        return until

    async def bulk(self, tenant_id: str, subscriber_id: str, body: BulkBody) -> BulkResult:
        """Mark all seen or read, or archive all (read) notifications, in one feed or
        all; snoozed notifications, hidden from the lists, are left alone."""
        if body.feed is not None:
            _check_name("feed", body.feed, "/feed")
        now = self._now()
        async with self._context.store.transaction() as tx:
            inbox = InboxTx(tx)
            await inbox.take_seqs(tenant_id, subscriber_id, 0)
            ids = await inbox.ids_where(
                tenant_id,
                subscriber_id,
                feed=body.feed,
                now=now,
                unseen=body.action == "seen",
                unread=body.action == "read",
                read=body.action == "archive_read",
                limit=MAX_BULK + 1,
            )
            for notification_id in ids[:MAX_BULK]:
                item = await inbox.get(tenant_id, notification_id)
                if item is None:
                    continue
                if body.action == "seen":
                    changed = msgspec.structs.replace(item, seen_at=now)
                elif body.action == "read":
                    changed = msgspec.structs.replace(
                        item, seen_at=item.seen_at or now, read_at=now
                    )
                else:
                    changed = msgspec.structs.replace(item, archived_at=now)
                await inbox.update(changed, now=now)
        changed_count = min(len(ids), MAX_BULK)
        if changed_count:
            self.feed.announce([(tenant_id, subscriber_id)])
        return BulkResult(changed=changed_count, more=len(ids) > MAX_BULK)

    async def counts(self, tenant_id: str, subscriber_id: str) -> CountsView:
        """A subscriber's counts per feed and in all."""
        async with self._context.store.transaction() as tx:
            inbox = InboxTx(tx)
            seq = await inbox.last_seq(tenant_id, subscriber_id)
            feeds = await inbox.counts(tenant_id, subscriber_id, now=self._now())
        return CountsView(
            feeds={
                name: Counts(total=c.total, unseen=c.unseen, unread=c.unread)
                for name, c in feeds.items()
            },
            all=_sum(feeds),
            seq=seq,
        )

    async def changes(
        self, tenant_id: str, subscriber_id: str, *, after: int = 0, limit: int = MAX_PAGE
    ) -> ChangesPage:
        """The subscriber's changes after sequence number `after`, in order.

        Raises:
            RequestInvalid: a cursor out of 0..INT64_MAX, or past the subscriber's
                last change (`details.cursor` is that change's number, so nothing
                up to `after` is skipped silently), or a limit out of 1..MAX_PAGE.
        """
        if not 0 <= after <= INT64_MAX:
            raise RequestInvalid(
                f"after is a sequence number, 0 to {INT64_MAX}", details={"pointer": "after"}
            )
        if not 1 <= limit <= MAX_PAGE:
            raise RequestInvalid(f"limit is 1 to {MAX_PAGE}", details={"pointer": "limit"})
        async with self._context.store.transaction() as tx:
            found = await InboxTx(tx).changes_after(
                tenant_id, subscriber_id, after, limit=limit + 1
            )
            last = await InboxTx(tx).last_seq(tenant_id, subscriber_id) if not found else after
        if last < after:
            raise RequestInvalid(
                f"after {after} is past this subscriber's last change, {last}:"
                " a cursor is the seq of a change this subscriber got (0 for everything)",
                details={"pointer": "after", "cursor": last},
            )
        more = len(found) > limit
        found = found[:limit]
        return ChangesPage(
            changes=[change_view(c) for c in found],
            cursor=found[-1].seq if found else after,
            more=more,
        )

    async def click(
        self, tenant_id: str, subscriber_id: str, notification_id: str, index: int
    ) -> ClickResult:
        """Click the action CTA `index` of a notification. The first click acts: it
        is recorded on the notification and, for a NOTIFY step's notification, sent
        back to the run (resuming a step that awaits an action, once for the whole
        group; sending the CTA's signal or event). A repeated click does nothing more.

        Raises:
            NotificationNotFound: not this subscriber's notification.
            NotificationNotActionable: no CTA `index`, or it is a link.
        """
        now = self._now()
        event: tuple[str, dict[str, Any], str] | None = None
        resumed = duplicate = False
        async with self._context.store.transaction() as tx:
            inbox = InboxTx(tx)
            await inbox.take_seqs(tenant_id, subscriber_id, 0)
            item = await self._find(inbox, tenant_id, notification_id, subscriber_id)
            if not 0 <= index < len(item.ctas) or not item.ctas[index].get("action"):
                raise NotificationNotActionable(
                    f"notification {notification_id!r} has no action CTA {index}",
                    details={"notification_id": notification_id, "cta": index},
                )
            cta = item.ctas[index]
            action = str(cta["action"])
            if item.acted is not None:
                # Whichever CTA a later click names, the first click's action stands.
                duplicate, action = True, str(item.acted.get("action", action))
            else:
                acted = {
                    "action": action,
                    "cta": index,
                    "subscriber_id": subscriber_id,
                    "at": utc_text(now),
                }
                item = await inbox.update(
                    msgspec.structs.replace(
                        item, acted=acted, seen_at=item.seen_at or now, read_at=item.read_at or now
                    ),
                    now=now,
                )
                resumed, event = await self._answer_run(tx, inbox, item, cta, acted, now)
        if not duplicate:
            self._context.wake.notify(Topic.INBOX)
            self.feed.announce([(tenant_id, subscriber_id)])
        if event is not None:
            name, data, event_id = event
            await self._events.send(tenant_id, name, data, event_id)
        return ClickResult(
            notification=view(item), action=action, resumed=resumed, duplicate=duplicate
        )

    async def _answer_run(
        self,
        tx: Tx,
        inbox: InboxTx,
        item: Notification,
        cta: dict[str, Any],
        acted: dict[str, Any],
        now: datetime,
    ) -> tuple[bool, tuple[str, dict[str, Any], str] | None]:
        if item.run_id is None or item.group_id is None:
            return False, None
        payload = {
            "action": acted["action"],
            "cta": acted["cta"],
            "subscriber_id": acted["subscriber_id"],
            "notification_id": item.id,
        }
        run = await tx.get_run(item.tenant_id, item.run_id)
        alive = run is not None and not run.status.terminal
        inputs: list[NewInboxItem] = []
        resumed = False
        group = await inbox.get_group(item.tenant_id, item.group_id)
        first = group is not None and await inbox.act_on_group(item.tenant_id, item.group_id, acted)
        if first and group is not None and group.await_action and alive:
            inputs.append(
                NewInboxItem(
                    tenant_id=item.tenant_id,
                    run_id=item.run_id,
                    input=SignalReceived(
                        signal_id=f"inbox:{item.group_id}",
                        name=notify_signal(group.step_ref),
                        payload=payload,
                    ),
                    available_at=now,
                )
            )
            resumed = True
        signal = cta.get("signal")
        if isinstance(signal, str) and alive:
            inputs.append(
                NewInboxItem(
                    tenant_id=item.tenant_id,
                    run_id=item.run_id,
                    input=SignalReceived(
                        signal_id=f"inbox:{item.id}:{acted['cta']}", name=signal, payload=payload
                    ),
                    available_at=now,
                )
            )
        if inputs:
            await tx.enqueue_inbox(inputs)
        event = cta.get("event")
        if isinstance(event, str):
            data = {**payload, "run_id": item.run_id}
            return resumed, (event, data, f"inbox:{item.id}:{acted['cta']}")
        return resumed, None

    async def _find(
        self,
        inbox: InboxTx,
        tenant_id: str,
        notification_id: str,
        subscriber_id: str | None,
    ) -> Notification:
        item = await inbox.get(tenant_id, notification_id)
        if item is None or (subscriber_id is not None and item.subscriber_id != subscriber_id):
            raise NotificationNotFound(notification_id)
        return item


def _apply_state(
    item: Notification, body: StateBody, until: datetime | None, now: datetime
) -> Notification:
    changed = item
    if body.seen is not None:
        changed = msgspec.structs.replace(
            changed, seen_at=(changed.seen_at or now) if body.seen else None
        )
    if body.read is not None:
        changed = msgspec.structs.replace(
            changed,
            read_at=(changed.read_at or now) if body.read else None,
            seen_at=(changed.seen_at or now) if body.read else changed.seen_at,
        )
    if body.archived is not None:
        changed = msgspec.structs.replace(
            changed, archived_at=(changed.archived_at or now) if body.archived else None
        )
    if until is not None:
        changed = msgspec.structs.replace(changed, snoozed_until=until)
    elif body.unsnooze:
        changed = msgspec.structs.replace(changed, snoozed_until=None)
    return changed


__all__ = [
    "BulkBody",
    "BulkResult",
    "ChangeView",
    "ChangesPage",
    "ClickResult",
    "Counts",
    "CountsView",
    "Cta",
    "CtaBody",
    "InboxService",
    "NotificationPage",
    "NotificationView",
    "PreferenceRule",
    "Preferences",
    "SecretView",
    "SendBody",
    "SendResult",
    "StateBody",
    "change_view",
    "subscriber_token",
    "view",
]
