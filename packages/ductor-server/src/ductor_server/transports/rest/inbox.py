"""The inbox over HTTP and WebSocket: `/v1/inbox/...` for the tenant (API key) and
`/v1/inbox/me/...` for a subscriber's own client (subscriber token). Thin handlers.

A subscriber's REST calls carry `X-Ductor-Tenant`, `X-Ductor-Subscriber` and
`X-Ductor-Subscriber-Token`; its WebSocket (`/v1/inbox/me/ws`, which a browser
cannot give headers) sends them in its first message, within `AUTH_SECONDS`; a
process lets at most `MAX_WAITING_FOR_AUTH` sockets wait for that message at
once. Wrong credentials are a 404 `inbox.not_found`, as another subscriber's
notification is a 404. A live socket checks its token again before each read of
the store, so rotating the inbox secret closes the sockets the old tokens opened
(at their next change, or their next idle read, within `SOCKET_POLL_SECONDS`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, Response, Router, WebSocket, delete, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.di import NamedDependency, Provide
from litestar.exceptions import WebSocketDisconnect
from litestar.handlers import BaseRouteHandler, websocket
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_core.errors import DuctorError
from ductor_server.errors import InboxNotFound, InboxSocketLimit, RequestInvalid
from ductor_server.services.inbox import (
    BulkBody,
    BulkResult,
    ChangesPage,
    ClickResult,
    CountsView,
    InboxService,
    NotificationPage,
    NotificationView,
    Preferences,
    SecretView,
    SendBody,
    SendResult,
    StateBody,
)
from ductor_server.services.inbox_email import (
    EmailPage,
    EmailView,
    SubscriberBody,
    SubscriberView,
)
from ductor_server.services.json_limits import INT64_MAX
from ductor_server.transports.rest.bodies import NO_BODY, EmptyBody, JsonBody, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS, also_ok, status_for
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key
from ductor_server.transports.rest.parameters import refuse_nul_parameters

SOCKET_POLL_SECONDS = 5.0
"""How long an idle WebSocket waits for a push before reading the store anyway
(a push lost with Redis costs at most this much latency)."""

AUTH_SECONDS = 10.0
"""How long a new WebSocket has to send its `auth` message."""

MAX_WAITING_FOR_AUTH = 1_000
"""WebSockets one server process lets wait for their `auth` message at once:
each holds a task and memory before any credential is checked, so without a cap
anyone could hold thousands for `AUTH_SECONDS` each. One more is refused at once."""


MAX_SOCKET_MESSAGE = 64 * 1024
"""The largest message, in bytes, a client may send on an inbox WebSocket (an
`auth` message is well under 1 KiB). The server (`ductor serve`, `ductor dev`)
closes a socket that announces a bigger one with code 1009 before reading it:
uvicorn's default of 16 MiB let every socket waiting for its `auth` hold that much."""


def provide_inbox(request: Request[Any, Any, Any]) -> InboxService:
    """The inbox service."""
    return services_of(request).inbox


class Subscriber(msgspec.Struct, frozen=True):
    """Who a subscriber call is for, once its token checked out."""

    tenant_id: str
    subscriber_id: str


def _header_readings(value: str) -> list[str]:
    """The ids a header value may mean: its UTF-8 reading when its bytes are UTF-8
    (a server or app client sending any subscriber id), then the Latin-1 one, as
    the server decoded it (a browser can send only Latin-1 characters in a
    header). Both when they differ: `Ã©` in Latin-1 is the UTF-8 bytes of `é`,
    and only the token tells which subscriber sent it."""
    raw = value.encode("latin-1")
    try:
        utf8 = raw.decode("utf-8")
    except UnicodeDecodeError:
        return [value]
    return [utf8] if utf8 == value else [utf8, value]


async def require_subscriber(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard of `/v1/inbox/me`: the subscriber headers must carry a valid token.

    Raises:
        InboxNotFound: missing headers, no inbox secret, or a token that does not match.
    """
    headers = connection.headers
    tenant_id = headers.get("x-ductor-tenant") or ""
    token = headers.get("x-ductor-subscriber-token") or ""
    inbox = services_of(connection).inbox
    *others, last = _header_readings(headers.get("x-ductor-subscriber") or "")
    for subscriber_id in others:
        with contextlib.suppress(InboxNotFound):
            await inbox.authenticate(tenant_id, subscriber_id, token)
            connection.state.subscriber = Subscriber(tenant_id, subscriber_id)
            return
    await inbox.authenticate(tenant_id, last, token)
    connection.state.subscriber = Subscriber(tenant_id, last)


def provide_subscriber(request: Request[Any, Any, Any]) -> Subscriber:
    """The subscriber `require_subscriber` let in."""
    subscriber: Subscriber = request.state.subscriber
    return subscriber


# --- the tenant's API ---------------------------------------------------------------------


class InboxController(Controller):
    """Notifications, preferences and the inbox secret, as the tenant manages them."""

    path = "/v1/inbox"
    tags = ("inbox",)
    dependencies = {"inbox": Provide(provide_inbox, sync_to_thread=False)}  # noqa: RUF012

    @post(
        "/notifications",
        status_code=201,
        responses=also_ok(SendResult, "Suppressed by the subscriber's preferences: nothing stored"),
    )
    async def send(
        self,
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
        data: JSONBody[SendBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[SendResult]:
        """Send a notification to one subscriber; 200 with `suppressed` when the
        subscriber's preferences turn the in-app channel off."""
        key = checked_key(idempotency_key)
        return answered(await inbox.send(tenant_id, required(data), idempotency_key=key))

    @get("/notifications", responses=V1_ERRORS)
    async def page(
        self,
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
        # Required (as the schema says), but its absence is refused by the service
        # with a pointer, as an empty or bad one is.
        subscriber_id: Annotated[str | None, QueryParameter(required=True)] = None,
        feed: FromQuery[str | None] = None,
        status: FromQuery[str] = "all",
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 50,
    ) -> NotificationPage:
        """A subscriber's notifications, newest first (`status`: all, unseen,
        unread, archived, snoozed)."""
        return await inbox.list_notifications(
            tenant_id, subscriber_id or "", feed=feed, status=status, cursor=cursor, limit=limit
        )

    @get("/notifications/{notification_id:str}", responses=V1_ERRORS)
    async def get_notification(
        self,
        notification_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
    ) -> NotificationView:
        """One notification of any of the tenant's subscribers."""
        return await inbox.get(tenant_id, notification_id)

    @delete("/notifications/{notification_id:str}", status_code=204, responses=V1_ERRORS)
    async def delete_notification(
        self,
        notification_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
    ) -> None:
        """Delete a notification; its subscriber's sessions get a `deleted` change."""
        await inbox.delete(tenant_id, notification_id)

    @get("/subscribers/{subscriber_id:str}", responses=V1_ERRORS)
    async def subscriber(
        self,
        subscriber_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
    ) -> SubscriberView:
        """A subscriber's profile: the address its emails go to (null: none)."""
        return await inbox.subscriber(tenant_id, subscriber_id)

    @put("/subscribers/{subscriber_id:str}", responses=V1_ERRORS)
    async def set_subscriber(
        self,
        subscriber_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
        data: JSONBody[SubscriberBody | NoBody] = NO_BODY,
    ) -> SubscriberView:
        """Set a subscriber's profile (`{"email": address | null}`)."""
        return await inbox.set_subscriber(tenant_id, subscriber_id, required(data))

    @get("/emails", responses=V1_ERRORS)
    async def emails(
        self,
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
        run_id: FromQuery[str | None] = None,
        subscriber_id: FromQuery[str | None] = None,
        status: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 50,
    ) -> EmailPage:
        """The tenant's outbox emails, oldest first (`status`: pending, sent, failed)."""
        return await inbox.email.list_emails(
            tenant_id,
            run_id=run_id,
            subscriber_id=subscriber_id,
            status=status,
            cursor=cursor,
            limit=limit,
        )

    @get("/emails/{email_id:str}", responses=V1_ERRORS)
    async def get_email(
        self,
        email_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
    ) -> EmailView:
        """One outbox email and its delivery state."""
        return await inbox.email.get_email(tenant_id, email_id)

    @get("/subscribers/{subscriber_id:str}/preferences", responses=V1_ERRORS)
    async def preferences(
        self,
        subscriber_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
    ) -> Preferences:
        """A subscriber's preference rules."""
        return await inbox.preferences(tenant_id, subscriber_id)

    @put("/subscribers/{subscriber_id:str}/preferences", responses=V1_ERRORS)
    async def set_preferences(
        self,
        subscriber_id: FromPath[str],
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
        data: JSONBody[Preferences | NoBody] = NO_BODY,
    ) -> Preferences:
        """Replace a subscriber's preference rules."""
        return await inbox.set_preferences(tenant_id, subscriber_id, required(data))

    @get("/secret", responses=V1_ERRORS)
    async def secret(
        self, tenant_id: NamedDependency[str], inbox: NamedDependency[InboxService]
    ) -> SecretView:
        """The inbox secret subscriber tokens are HMAC-SHA256 under (made on first use).
        Keep it on your server: a token is `hex(hmac_sha256(secret, subscriber_id))`."""
        return await inbox.secret(tenant_id)

    @post("/secret/rotate", status_code=200, responses=V1_ERRORS)
    async def rotate_secret(
        self,
        tenant_id: NamedDependency[str],
        inbox: NamedDependency[InboxService],
        data: JSONBody[EmptyBody | NoBody] = NO_BODY,
    ) -> SecretView:
        """Replace the inbox secret; every earlier subscriber token stops working.
        It takes no body (`{}` at most)."""
        return await inbox.rotate_secret(tenant_id)


# --- the subscriber's API -------------------------------------------------------------------


class MyInboxController(Controller):
    """A subscriber's own notifications, for the subscriber's client."""

    path = "/v1/inbox/me"
    tags = ("inbox",)

    @get("/notifications", responses=V1_ERRORS)
    async def page(
        self,
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
        feed: FromQuery[str | None] = None,
        status: FromQuery[str] = "all",
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 50,
    ) -> NotificationPage:
        """My notifications, newest first."""
        return await inbox.list_notifications(
            me.tenant_id, me.subscriber_id, feed=feed, status=status, cursor=cursor, limit=limit
        )

    @get("/notifications/{notification_id:str}", responses=V1_ERRORS)
    async def get_notification(
        self,
        notification_id: FromPath[str],
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
    ) -> NotificationView:
        """One of my notifications."""
        return await inbox.get(me.tenant_id, notification_id, subscriber_id=me.subscriber_id)

    @patch("/notifications/{notification_id:str}", responses=V1_ERRORS)
    async def set_state(
        self,
        notification_id: FromPath[str],
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
        data: JSONBody[StateBody | NoBody] = NO_BODY,
    ) -> NotificationView:
        """Mark one of my notifications seen, read, archived (or not), or snooze it."""
        return await inbox.set_state(
            me.tenant_id, me.subscriber_id, notification_id, required(data)
        )

    @post(
        "/notifications/{notification_id:str}/ctas/{index:int}/click",
        status_code=200,
        responses=V1_ERRORS,
    )
    async def click(
        self,
        notification_id: FromPath[str],
        index: FromPath[int],
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
        data: JSONBody[EmptyBody | NoBody] = NO_BODY,
    ) -> ClickResult:
        """Click action CTA `index` (0 or 1): sent back to the run once, however
        often it is clicked."""
        return await inbox.click(me.tenant_id, me.subscriber_id, notification_id, index)

    @post("/bulk", status_code=200, responses=V1_ERRORS)
    async def bulk(
        self,
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
        data: JSONBody[BulkBody | NoBody] = NO_BODY,
    ) -> BulkResult:
        """Mark all seen or read, archive all read or all, in one feed or every feed."""
        return await inbox.bulk(me.tenant_id, me.subscriber_id, required(data))

    @get("/counts", responses=V1_ERRORS)
    async def counts(
        self, me: NamedDependency[Subscriber], inbox: NamedDependency[InboxService]
    ) -> CountsView:
        """My counts (total, unseen, unread) per feed and in all."""
        return await inbox.counts(me.tenant_id, me.subscriber_id)

    @get("/changes", responses=V1_ERRORS)
    async def changes(
        self,
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
        after: Annotated[int, QueryParameter(ge=0, le=INT64_MAX)] = 0,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 200,
    ) -> ChangesPage:
        """The polling fallback of the WebSocket: my changes after sequence `after`."""
        return await inbox.changes(me.tenant_id, me.subscriber_id, after=after, limit=limit)

    @get("/preferences", responses=V1_ERRORS)
    async def preferences(
        self, me: NamedDependency[Subscriber], inbox: NamedDependency[InboxService]
    ) -> Preferences:
        """My preference rules."""
        return await inbox.preferences(me.tenant_id, me.subscriber_id)

    @put("/preferences", responses=V1_ERRORS)
    async def set_preferences(
        self,
        me: NamedDependency[Subscriber],
        inbox: NamedDependency[InboxService],
        data: JSONBody[Preferences | NoBody] = NO_BODY,
    ) -> Preferences:
        """Replace my preference rules."""
        return await inbox.set_preferences(me.tenant_id, me.subscriber_id, required(data))


# --- the WebSocket ------------------------------------------------------------------------


class SocketAuth(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The first message of an inbox WebSocket."""

    type: str
    tenant_id: str
    subscriber_id: str
    token: str
    after: int = 0


class _WaitingForAuth:
    """How many of this process's WebSockets are waiting for their `auth` message."""

    def __init__(self) -> None:
        self.count = 0


_WAITING_FOR_AUTH = _WaitingForAuth()


def _frame(kind: str, body: msgspec.Struct | None = None, **fields: Any) -> str:
    message: dict[str, Any] = {"type": kind, **fields}
    if body is not None:
        message.update(msgspec.to_builtins(body))
    return msgspec.json.encode(message).decode()


async def _close_with(socket: WebSocket[Any, Any, Any], error: DuctorError) -> None:
    status = status_for(error.code, retryable=error.retryable)
    fields: dict[str, Any] = {"status": status, "code": error.code, "message": error.message}
    if error.details is not None:
        fields["details"] = msgspec.to_builtins(error.details)
    with contextlib.suppress(Exception):
        await socket.send_text(_frame("error", **fields))
        await socket.close(code=4000 + status if 400 <= status < 600 else 4000)


@websocket("/v1/inbox/me/ws")
async def inbox_socket(socket: WebSocket[Any, Any, Any]) -> None:
    """Live inbox: send `{"type": "auth", "tenant_id", "subscriber_id", "token",
    "after"}` first; receive every change after `after` in order (`change`), then
    counts (`counts`), then each new change as it commits. `ping` gets `pong`."""
    if _WAITING_FOR_AUTH.count >= MAX_WAITING_FOR_AUTH:
        await socket.accept()
        await _close_with(socket, InboxSocketLimit("unauthenticated", MAX_WAITING_FOR_AUTH))
        return
    _WAITING_FOR_AUTH.count += 1
    try:
        await socket.accept()
        inbox = services_of(socket).inbox
        async with asyncio.timeout(AUTH_SECONDS):
            raw = await socket.receive_data(mode="text")
        auth = msgspec.json.decode(raw, type=SocketAuth)
        if auth.type != "auth" or not 0 <= auth.after <= INT64_MAX:
            raise msgspec.ValidationError("the first message must be an auth message")
        await inbox.authenticate(auth.tenant_id, auth.subscriber_id, auth.token)
    except (TimeoutError, msgspec.DecodeError, msgspec.ValidationError):
        await _close_with(socket, InboxNotFound())
        return
    except WebSocketDisconnect:
        return
    except DuctorError as error:
        await _close_with(socket, error)
        return
    finally:
        _WAITING_FOR_AUTH.count -= 1
    tenant_id, subscriber_id = auth.tenant_id, auth.subscriber_id
    try:
        listener = inbox.feed.listen(tenant_id, subscriber_id)
    except InboxSocketLimit as error:
        await _close_with(socket, error)
        return

    async def pump() -> None:
        cursor = auth.after
        await socket.send_text(_frame("ready", cursor=cursor))
        await socket.send_text(_frame("counts", await inbox.counts(tenant_id, subscriber_id)))
        while True:
            # The token is checked again before each read: once the tenant rotates
            # its secret, a socket the old token opened gets nothing more. A cursor
            # past the subscriber's last change is refused rather than waited on.
            try:
                await inbox.authenticate(tenant_id, subscriber_id, auth.token)
                page = await inbox.changes(tenant_id, subscriber_id, after=cursor)
            except (InboxNotFound, RequestInvalid) as error:
                await _close_with(socket, error)
                return
            for change in page.changes:
                await socket.send_text(_frame("change", change))
            cursor = page.cursor
            if page.changes:
                counts = await inbox.counts(tenant_id, subscriber_id)
                await socket.send_text(_frame("counts", counts))
            if not page.more:
                await listener.wait(SOCKET_POLL_SECONDS)

    async def read() -> None:
        while True:
            raw = await socket.receive_data(mode="text")
            # Anything but a ping is ignored: a list, a string, or JSON nested
            # deeper than the decoder goes (RecursionError) alike.
            with contextlib.suppress(msgspec.DecodeError, AttributeError, RecursionError):
                if msgspec.json.decode(raw).get("type") == "ping":
                    await socket.send_text(_frame("pong"))

    tasks = [asyncio.create_task(pump()), asyncio.create_task(read())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        listener.close()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await socket.close()


SUBSCRIBER_ROUTER = Router(
    "/",
    route_handlers=[MyInboxController],
    guards=[require_subscriber, refuse_nul_parameters],
    dependencies={
        "me": Provide(provide_subscriber, sync_to_thread=False),
        "inbox": Provide(provide_inbox, sync_to_thread=False),
    },
    dto=JsonBody,
    return_dto=None,
)
"""The subscriber's REST routes, authenticated by the subscriber headers."""

PUBLIC_HANDLERS = (SUBSCRIBER_ROUTER, inbox_socket)
"""The inbox routes outside the API-key guard: each checks a subscriber token."""

__all__ = [
    "MAX_SOCKET_MESSAGE",
    "PUBLIC_HANDLERS",
    "SUBSCRIBER_ROUTER",
    "InboxController",
    "MyInboxController",
    "inbox_socket",
]
