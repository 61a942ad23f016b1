"""`ConnectionService`, `InboxService`, `AiService` and `BridgeService`: the methods
of `/v1/connections`, `/v1/providers`, `/v1/inbox` (the tenant's side), `/v1/ai`
(settings, prices and the request log) and `/v1/bridge/apps`, each calling the
service function its REST route calls."""

from __future__ import annotations

from typing import TypeVar

from ductor.protocol import HealthResponse, SyncResponse
from ductor_server.providers import CheckResult
from ductor_server.services import AppView
from ductor_server.services.ai import (
    AiRequestPage,
    AiRequestView,
    AiSettingsBody,
    AiSettingsView,
    PriceBody,
    PriceView,
)
from ductor_server.services.bridge import AppKeyView, CreatedAppKey, grace_period
from ductor_server.services.connections import (
    ConnectionBody,
    ConnectionCheck,
    ConnectionPatch,
    ConnectionView,
    ProviderView,
)
from ductor_server.services.inbox import (
    NotificationPage,
    NotificationView,
    Preferences,
    SecretView,
    SendBody,
    SendResult,
)
from ductor_server.services.inbox_email import (
    EmailPage,
    EmailView,
    SubscriberBody,
    SubscriberView,
)
from ductor_server.transports.connect.method import (
    Cursor,
    Empty,
    Id,
    Limit200,
    Limit500,
    Method,
    Req,
    body_of,
    method,
)
from ductor_server.transports.rest.bridge import AppSyncBody, NewKeyBody


class ConnectionRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One connection."""

    name: Id


class UpdateConnectionRequest(ConnectionPatch, frozen=True, kw_only=True):
    """What to change in the connection `name` (the body of `PATCH /v1/connections/{name}`)."""

    name: Id


class ListNotificationsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One subscriber's notifications, newest first."""

    subscriber_id: Id
    feed: str | None = None
    status: str = "all"
    cursor: Cursor | None = None
    limit: Limit200 = 50


class NotificationRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One notification."""

    notification_id: Id


class SubscriberRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One subscriber."""

    subscriber_id: Id


class PutSubscriberRequest(SubscriberBody, frozen=True, kw_only=True):
    """A subscriber's profile (the body of `PUT /v1/inbox/subscribers/{id}`)."""

    subscriber_id: Id


class PutPreferencesRequest(Preferences, frozen=True, kw_only=True):
    """A subscriber's preference rules (the body of `PUT .../preferences`)."""

    subscriber_id: Id


class ListEmailsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The inbox's emails oldest first, by run, subscriber and status."""

    run_id: str | None = None
    subscriber_id: str | None = None
    status: str | None = None
    cursor: Cursor | None = None
    limit: Limit200 = 50


class EmailRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One inbox email."""

    email_id: Id


class PriceRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The price of one model."""

    model: Id


class PutPriceRequest(PriceBody, frozen=True, kw_only=True):
    """A model's price (the body of `PUT /v1/ai/prices/{model}`)."""

    model: Id


class ListAiRequestsRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Proxied AI requests newest first, paged by cursor."""

    cursor: Cursor | None = None
    limit: Limit500 = 50


class AiRequestRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One proxied AI request."""

    request_id: Id


class AppRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One bridge app."""

    app_id: Id


class CreateAppKeyRequest(NewKeyBody, frozen=True, kw_only=True):
    """A new signing key for an app; its other keys stay valid `grace_seconds`."""

    app_id: Id


class RevokeAppKeyRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Revoke one of an app's signing keys."""

    app_id: Id
    key_id: Id


T = TypeVar("T")

CONNECTIONS = "ConnectionService"
INBOX = "InboxService"
AI = "AiService"
BRIDGE = "BridgeService"

METHODS: tuple[Method, ...] = (
    method(
        CONNECTIONS,
        "CreateConnection",
        ConnectionBody,
        ConnectionView,
        lambda s, t, r, k: s.connections.create(t, r, idempotency_key=k),
        rest="POST /v1/connections",
        mutates=True,
        doc="Create a connection; its secrets are stored encrypted, shown as masks.",
    ),
    method(
        CONNECTIONS,
        "ValidateConnection",
        ConnectionBody,
        ConnectionCheck,
        lambda s, t, r, k: _check_connection(s.connections.check(r)),
        rest="POST /v1/connections/validate",
        doc="Check a connection as its create would, writing nothing.",
    ),
    method(
        CONNECTIONS,
        "ListConnections",
        Empty,
        list[ConnectionView],
        lambda s, t, r, k: s.connections.list_connections(t),
        rest="GET /v1/connections",
        doc="The tenant's connections, by name.",
    ),
    method(
        CONNECTIONS,
        "GetConnection",
        ConnectionRequest,
        ConnectionView,
        lambda s, t, r, k: s.connections.get(t, r.name),
        rest="GET /v1/connections/{name}",
        doc="One connection.",
    ),
    method(
        CONNECTIONS,
        "UpdateConnection",
        UpdateConnectionRequest,
        ConnectionView,
        lambda s, t, r, k: s.connections.update(
            t, r.name, body_of(r, ConnectionPatch), idempotency_key=k
        ),
        rest="PATCH /v1/connections/{name}",
        mutates=True,
        doc="Change a connection's description, config or secrets.",
    ),
    method(
        CONNECTIONS,
        "DeleteConnection",
        ConnectionRequest,
        None,
        lambda s, t, r, k: s.connections.delete(t, r.name),
        rest="DELETE /v1/connections/{name}",
        doc="Delete a connection.",
    ),
    method(
        CONNECTIONS,
        "TestConnection",
        ConnectionRequest,
        CheckResult,
        lambda s, t, r, k: s.connections.test(t, r.name),
        rest="POST /v1/connections/{name}/test",
        doc="Check the connection through the outbound guard.",
    ),
    method(
        CONNECTIONS,
        "ListProviders",
        Empty,
        list[ProviderView],
        lambda s, t, r, k: _now(s.connections.list_providers()),
        rest="GET /v1/providers",
        doc="Every provider connections may use, with its schemas.",
    ),
    method(
        INBOX,
        "SendNotification",
        SendBody,
        SendResult,
        lambda s, t, r, k: s.inbox.send(t, r, idempotency_key=k),
        rest="POST /v1/inbox/notifications",
        mutates=True,
        doc="Send a notification to one subscriber.",
    ),
    method(
        INBOX,
        "ListNotifications",
        ListNotificationsRequest,
        NotificationPage,
        lambda s, t, r, k: s.inbox.list_notifications(
            t, r.subscriber_id, feed=r.feed, status=r.status, cursor=r.cursor, limit=r.limit
        ),
        rest="GET /v1/inbox/notifications",
        doc="One subscriber's notifications, newest first.",
    ),
    method(
        INBOX,
        "GetNotification",
        NotificationRequest,
        NotificationView,
        lambda s, t, r, k: s.inbox.get(t, r.notification_id),
        rest="GET /v1/inbox/notifications/{notification_id}",
        doc="One notification.",
    ),
    method(
        INBOX,
        "DeleteNotification",
        NotificationRequest,
        None,
        lambda s, t, r, k: s.inbox.delete(t, r.notification_id),
        rest="DELETE /v1/inbox/notifications/{notification_id}",
        doc="Delete a notification.",
    ),
    method(
        INBOX,
        "GetSubscriber",
        SubscriberRequest,
        SubscriberView,
        lambda s, t, r, k: s.inbox.subscriber(t, r.subscriber_id),
        rest="GET /v1/inbox/subscribers/{subscriber_id}",
        doc="A subscriber's profile.",
    ),
    method(
        INBOX,
        "PutSubscriber",
        PutSubscriberRequest,
        SubscriberView,
        lambda s, t, r, k: s.inbox.set_subscriber(t, r.subscriber_id, body_of(r, SubscriberBody)),
        rest="PUT /v1/inbox/subscribers/{subscriber_id}",
        doc="Set a subscriber's profile.",
    ),
    method(
        INBOX,
        "GetPreferences",
        SubscriberRequest,
        Preferences,
        lambda s, t, r, k: s.inbox.preferences(t, r.subscriber_id),
        rest="GET /v1/inbox/subscribers/{subscriber_id}/preferences",
        doc="A subscriber's preference rules.",
    ),
    method(
        INBOX,
        "PutPreferences",
        PutPreferencesRequest,
        Preferences,
        lambda s, t, r, k: s.inbox.set_preferences(t, r.subscriber_id, body_of(r, Preferences)),
        rest="PUT /v1/inbox/subscribers/{subscriber_id}/preferences",
        doc="Replace a subscriber's preference rules.",
    ),
    method(
        INBOX,
        "ListEmails",
        ListEmailsRequest,
        EmailPage,
        lambda s, t, r, k: s.inbox.email.list_emails(
            t,
            run_id=r.run_id,
            subscriber_id=r.subscriber_id,
            status=r.status,
            cursor=r.cursor,
            limit=r.limit,
        ),
        rest="GET /v1/inbox/emails",
        doc="The inbox's emails oldest first.",
    ),
    method(
        INBOX,
        "GetEmail",
        EmailRequest,
        EmailView,
        lambda s, t, r, k: s.inbox.email.get_email(t, r.email_id),
        rest="GET /v1/inbox/emails/{email_id}",
        doc="One inbox email.",
    ),
    method(
        INBOX,
        "GetInboxSecret",
        Empty,
        SecretView,
        lambda s, t, r, k: s.inbox.secret(t),
        rest="GET /v1/inbox/secret",
        doc="The secret subscriber tokens are made with.",
    ),
    method(
        INBOX,
        "RotateInboxSecret",
        Empty,
        SecretView,
        lambda s, t, r, k: s.inbox.rotate_secret(t),
        rest="POST /v1/inbox/secret/rotate",
        doc="Replace the inbox secret (every subscriber token changes).",
    ),
    method(
        AI,
        "GetAiSettings",
        Empty,
        AiSettingsView,
        lambda s, t, r, k: s.ai.get_settings(t),
        rest="GET /v1/ai/settings",
        doc="The tenant's AI proxy settings.",
    ),
    method(
        AI,
        "PutAiSettings",
        AiSettingsBody,
        AiSettingsView,
        lambda s, t, r, k: s.ai.put_settings(t, r),
        rest="PUT /v1/ai/settings",
        doc="Replace the tenant's AI proxy settings.",
    ),
    method(
        AI,
        "ListPrices",
        Empty,
        list[PriceView],
        lambda s, t, r, k: s.ai.list_prices(t),
        rest="GET /v1/ai/prices",
        doc="Every model price of the tenant.",
    ),
    method(
        AI,
        "PutPrice",
        PutPriceRequest,
        PriceView,
        lambda s, t, r, k: s.ai.put_price(t, r.model, body_of(r, PriceBody)),
        rest="PUT /v1/ai/prices/{model}",
        doc="Set a model's price.",
    ),
    method(
        AI,
        "GetPrice",
        PriceRequest,
        PriceView,
        lambda s, t, r, k: s.ai.get_price(t, r.model),
        rest="GET /v1/ai/prices/{model}",
        doc="One model's price.",
    ),
    method(
        AI,
        "DeletePrice",
        PriceRequest,
        None,
        lambda s, t, r, k: s.ai.delete_price(t, r.model),
        rest="DELETE /v1/ai/prices/{model}",
        doc="Delete a model's price.",
    ),
    method(
        AI,
        "ListAiRequests",
        ListAiRequestsRequest,
        AiRequestPage,
        lambda s, t, r, k: s.ai.list_requests(t, cursor=r.cursor, limit=r.limit),
        rest="GET /v1/ai/requests",
        doc="Proxied requests newest first, with their cost.",
    ),
    method(
        AI,
        "GetAiRequest",
        AiRequestRequest,
        AiRequestView,
        lambda s, t, r, k: s.ai.get_request(t, r.request_id),
        rest="GET /v1/ai/requests/{request_id}",
        doc="One proxied request.",
    ),
    method(
        BRIDGE,
        "SyncApp",
        AppSyncBody,
        SyncResponse,
        lambda s, t, r, k: s.bridge.request_sync(r.url, tenant_id=t, app_id=r.app_id),
        rest="POST /v1/bridge/apps",
        doc="Ask the app at `url` to sync its workflows.",
    ),
    method(
        BRIDGE,
        "ListApps",
        Empty,
        list[AppView],
        lambda s, t, r, k: s.bridge.apps(t),
        rest="GET /v1/bridge/apps",
        doc="Every registered app.",
    ),
    method(
        BRIDGE,
        "CreateAppKey",
        CreateAppKeyRequest,
        CreatedAppKey,
        lambda s, t, r, k: s.bridge.create_key(t, r.app_id, grace=grace_period(r.grace_seconds)),
        rest="POST /v1/bridge/apps/{app_id}/keys",
        doc="Create a signing key for an app.",
    ),
    method(
        BRIDGE,
        "ListAppKeys",
        AppRequest,
        list[AppKeyView],
        lambda s, t, r, k: s.bridge.list_keys(t, r.app_id),
        rest="GET /v1/bridge/apps/{app_id}/keys",
        doc="An app's signing keys (never their secrets).",
    ),
    method(
        BRIDGE,
        "RevokeAppKey",
        RevokeAppKeyRequest,
        AppKeyView,
        lambda s, t, r, k: s.bridge.revoke_key(t, r.app_id, r.key_id),
        rest="DELETE /v1/bridge/apps/{app_id}/keys/{key_id}",
        doc="Revoke one of an app's signing keys.",
    ),
    method(
        BRIDGE,
        "ProbeApp",
        AppRequest,
        HealthResponse,
        lambda s, t, r, k: s.bridge.probe(t, r.app_id),
        rest="POST /v1/bridge/apps/{app_id}/health",
        doc="Call a registered app's health action.",
    ),
)
"""The methods of the connection, inbox, AI and bridge-app services."""


async def _now(value: T) -> T:
    # A synchronous service answer, as the awaitable a method's call returns.
    return value


async def _check_connection(problems: list[dict[str, str]]) -> ConnectionCheck:
    return ConnectionCheck(valid=not problems, problems=problems)


__all__ = ["AI", "BRIDGE", "CONNECTIONS", "INBOX", "METHODS"]
