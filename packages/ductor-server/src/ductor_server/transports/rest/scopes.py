"""The scope each API-key route needs: one table, read by the `require_api_key` guard
(and, through the REST call each tool mirrors, by the MCP tools).

The rule the table follows, with the exceptions it spells out (docs/security.md
states the same and a test holds the two together):

- `GET` needs `read`, any other method `write`;
- `POST /v1/events` and `POST /v1/runs/{run_id}/signals/{name}` need
  `events:send` (so a producer's key can send them, and `write` implies it);
- the `validate` calls write nothing and need `read`;
- `GET /v1/inbox/secret` needs `write`: the secret mints subscriber tokens;
- everything under `/v1/keys` needs `admin`.

A route missing from the table needs `admin` (closed by default), and a test
fails until it is listed. Routes that take no API key (health, public keys,
webhooks, a subscriber's own inbox, the operator's `/v1/tenants`) are listed
apart, in `NO_API_KEY`. No route handlers here.
"""

from __future__ import annotations

from ductor_server.services.keys import Scope

READ, WRITE, EVENTS, ADMIN = Scope.READ, Scope.WRITE, Scope.EVENTS_SEND, Scope.ADMIN

ROUTE_SCOPES: dict[str, Scope] = {
    # workflows
    "GET /v1/workflows": READ,
    "POST /v1/workflows": WRITE,
    "POST /v1/workflows/validate": READ,
    "GET /v1/workflows/{slug}": READ,
    "GET /v1/workflows/{slug}/versions/{version}": READ,
    # runs, events and signals
    "GET /v1/runs": READ,
    "POST /v1/runs": WRITE,
    "POST /v1/runs/batch": WRITE,
    "GET /v1/runs/{run_id}": READ,
    "GET /v1/runs/{run_id}/history": READ,
    "POST /v1/runs/{run_id}/cancel": WRITE,
    "POST /v1/runs/{run_id}/rerun": WRITE,
    "POST /v1/runs/{run_id}/signals/{name}": EVENTS,
    "POST /v1/events": EVENTS,
    # routing
    "GET /v1/workers": READ,
    "POST /v1/workers": WRITE,
    "GET /v1/workers/{worker_id}": READ,
    "DELETE /v1/workers/{worker_id}": WRITE,
    "GET /v1/pools": READ,
    "POST /v1/pools": WRITE,
    "GET /v1/pools/{pool_id}": READ,
    "DELETE /v1/pools/{pool_id}": WRITE,
    "GET /v1/pools/{pool_id}/shadow-report": READ,
    "GET /v1/pools/{pool_id}/settlement": READ,
    "PUT /v1/pools/{pool_id}/settlement": WRITE,
    "GET /v1/rules": READ,
    "POST /v1/rules": WRITE,
    "GET /v1/rules/versions": READ,
    "GET /v1/rules/versions/{version}": READ,
    "POST /v1/routing/validate": READ,
    "POST /v1/route": WRITE,
    "GET /v1/decisions/{decision_id}": READ,
    "GET /v1/assignments": READ,
    "GET /v1/assignments/{assignment_id}": READ,
    "POST /v1/assignments/{assignment_id}/accept": WRITE,
    "POST /v1/assignments/{assignment_id}/complete": WRITE,
    "POST /v1/assignments/{assignment_id}/reject": WRITE,
    "POST /v1/assignments/{assignment_id}/return": WRITE,
    # the bridge (its app-facing calls are signed as well)
    "GET /v1/bridge/apps": READ,
    "POST /v1/bridge/apps": WRITE,
    "POST /v1/bridge/apps/{app_id}/health": WRITE,
    "GET /v1/bridge/apps/{app_id}/keys": READ,
    "POST /v1/bridge/apps/{app_id}/keys": WRITE,
    "DELETE /v1/bridge/apps/{app_id}/keys/{key_id}": WRITE,
    "POST /v1/bridge/sync": WRITE,
    "POST /v1/bridge/runs": WRITE,
    "POST /v1/bridge/runs/{run_id}/checkpoint": WRITE,
    "GET /v1/bridge/runs/{run_id}/payload": READ,
    # the ledger, holds and wallets
    "GET /v1/accounts": READ,
    "POST /v1/accounts": WRITE,
    "GET /v1/accounts/{code}": READ,
    "GET /v1/ledger/entries": READ,
    "POST /v1/ledger/entries": WRITE,
    "POST /v1/ledger/entries/batch": WRITE,
    "GET /v1/ledger/entries/{entry_id}": READ,
    "GET /v1/holds": READ,
    "POST /v1/holds": WRITE,
    "GET /v1/holds/{hold_id}": READ,
    "POST /v1/holds/{hold_id}/post": WRITE,
    "POST /v1/holds/{hold_id}/void": WRITE,
    "GET /v1/topups": READ,
    "POST /v1/topups": WRITE,
    "GET /v1/topups/{topup_id}": READ,
    "GET /v1/receipts": READ,
    "GET /v1/receipts/{receipt_id}": READ,
    # metering, budgets and plans
    "GET /v1/meters": READ,
    "POST /v1/meters": WRITE,
    "GET /v1/meters/{name}": READ,
    "GET /v1/usage": READ,
    "POST /v1/usage": WRITE,
    "GET /v1/budgets": READ,
    "POST /v1/budgets": WRITE,
    "GET /v1/budgets/{meter}": READ,
    "PUT /v1/budgets/{meter}": WRITE,
    "DELETE /v1/budgets/{meter}": WRITE,
    "GET /v1/plans": READ,
    "POST /v1/plans": WRITE,
    "GET /v1/plans/{plan_id}": READ,
    "GET /v1/plan": READ,
    "PUT /v1/plan": WRITE,
    # extensions, providers and connections
    "GET /v1/extensions": READ,
    "GET /v1/providers": READ,
    "GET /v1/connections": READ,
    "POST /v1/connections": WRITE,
    "POST /v1/connections/validate": READ,
    "GET /v1/connections/{name}": READ,
    "PATCH /v1/connections/{name}": WRITE,
    "DELETE /v1/connections/{name}": WRITE,
    "POST /v1/connections/{name}/test": WRITE,
    # the inbox (the tenant's side; a subscriber's own is in NO_API_KEY)
    "GET /v1/inbox/notifications": READ,
    "POST /v1/inbox/notifications": WRITE,
    "GET /v1/inbox/notifications/{notification_id}": READ,
    "DELETE /v1/inbox/notifications/{notification_id}": WRITE,
    "GET /v1/inbox/subscribers/{subscriber_id}": READ,
    "PUT /v1/inbox/subscribers/{subscriber_id}": WRITE,
    "GET /v1/inbox/subscribers/{subscriber_id}/preferences": READ,
    "PUT /v1/inbox/subscribers/{subscriber_id}/preferences": WRITE,
    "GET /v1/inbox/emails": READ,
    "GET /v1/inbox/emails/{email_id}": READ,
    "GET /v1/inbox/secret": WRITE,
    "POST /v1/inbox/secret/rotate": WRITE,
    # the inference proxy
    "POST /v1/ai/chat/completions": WRITE,
    "POST /v1/ai/embeddings": WRITE,
    "GET /v1/ai/settings": READ,
    "PUT /v1/ai/settings": WRITE,
    "GET /v1/ai/prices": READ,
    "GET /v1/ai/prices/{model}": READ,
    "PUT /v1/ai/prices/{model}": WRITE,
    "DELETE /v1/ai/prices/{model}": WRITE,
    "GET /v1/ai/requests": READ,
    "GET /v1/ai/requests/{request_id}": READ,
    # the chat agent (its tools run as the caller; none needs more than `write`)
    "GET /v1/agent/conversations": READ,
    "POST /v1/agent/conversations": WRITE,
    "GET /v1/agent/conversations/{conversation_id}": READ,
    "POST /v1/agent/conversations/{conversation_id}/messages": WRITE,
    # API keys
    "GET /v1/keys": ADMIN,
    "POST /v1/keys": ADMIN,
    "GET /v1/keys/{key_id}": ADMIN,
    "DELETE /v1/keys/{key_id}": ADMIN,
}
"""`"METHOD /path/template"` -> the scope a key needs to call it."""

NO_API_KEY: dict[str, str] = {
    "GET /healthz": "public",
    "GET /readyz": "public",
    "GET /.well-known/ductor-keys": "public",
    "GET /docs": "public",
    "GET /docs/{path}": "public",
    "POST /webhooks/stripe": "Stripe's signature",
    "GET /v1/tenants": "the operator key",
    "POST /v1/tenants": "the operator key",
    "POST /v1/tenants/{tenant_id}/keys": "the operator key",
    "GET /v1/admin/queue-policies": "the operator key",
    "GET /v1/admin/tenants/{tenant}/queue-policy": "the operator key",
    "PUT /v1/admin/tenants/{tenant}/queue-policy": "the operator key",
    "DELETE /v1/admin/tenants/{tenant}/queue-policy": "the operator key",
    "ASGI /mcp": "an API key, checked per tool (see transports/mcp)",
    "WS /v1/inbox/me/ws": "a subscriber token",
}
"""Routes that take no API key, and what they check instead (the OpenAPI document's
own pages under `/docs/`, a subscriber's `/v1/inbox/me/...` calls, the Connect-RPC
services and the dashboard's files are matched by prefix in `checked_without_key`)."""

_PREFIXES = {
    "/docs/": "public",
    "/v1/inbox/me/": "a subscriber token",
    # Connect-RPC: one mount per service; each method needs the scope of the REST
    # call it mirrors, checked before its body is read (transports/connect).
    "/ductor.v1.": "an API key, checked per method against its REST call's scope",
    # The dashboard's static files; its pages call /v1 with the signed-in key.
    "/ui": "public (static files)",
}


def checked_without_key(route: str) -> str | None:
    """What a route of `NO_API_KEY` checks instead of an API key; None for others."""
    if route in NO_API_KEY:
        return NO_API_KEY[route]
    path = route.partition(" ")[2]
    for prefix, check in _PREFIXES.items():
        if path.startswith(prefix):
            return check
    return None


def scope_for(method: str, path_template: str) -> Scope | None:
    """The scope a call needs: the table's, `admin` for a route it lacks, and None
    (any valid key) for `OPTIONS`. `HEAD` needs what `GET` does."""
    method = method.upper()
    if method == "OPTIONS":
        return None
    if method == "HEAD":
        method = "GET"
    return ROUTE_SCOPES.get(f"{method} {path_template}", Scope.ADMIN)


__all__ = ["NO_API_KEY", "ROUTE_SCOPES", "checked_without_key", "scope_for"]
