"""Every route the app serves has a decided scope: an API-key route is in the one
table, a route without an API key says what it checks instead, and every MCP tool
needs what the REST call it mirrors needs."""

from __future__ import annotations

from ductor_server import Settings, create_app
from ductor_server.services.keys import Scope
from ductor_server.transports.mcp import TOOLS
from ductor_server.transports.mcp.server import tool_scope
from ductor_server.transports.rest.scopes import (
    NO_API_KEY,
    ROUTE_SCOPES,
    checked_without_key,
    scope_for,
)


def _routes() -> dict[str, set[str]]:
    """`"METHOD /path"` of every route the API role serves -> the names of its guards."""
    app = create_app(Settings())
    found: dict[str, set[str]] = {}
    for route in app.routes:
        handlers = getattr(route, "route_handlers", None) or [route.route_handler]  # type: ignore[attr-defined]
        for handler in handlers:
            guards = {g.__name__ for g in handler.resolve_guards()}
            methods = getattr(handler, "http_methods", None)
            if methods is None:
                kind = "WS" if type(route).__name__ == "WebSocketRoute" else "ASGI"
                methods = {kind}
            for method in methods - {"OPTIONS"}:
                found[f"{method} {route.path_format}"] = guards
    return found


def test_every_route_has_a_scope_or_says_what_it_checks_instead() -> None:
    routes = _routes()
    assert len(routes) > 120
    undecided = []
    for route, guards in sorted(routes.items()):
        if "require_api_key" in guards:
            if route not in ROUTE_SCOPES:
                undecided.append(route)
            assert checked_without_key(route) is None, route
        elif "require_operator_key" in guards:
            assert NO_API_KEY.get(route) == "the operator key", route
        else:
            assert route not in ROUTE_SCOPES, f"{route} is in the table but takes no key"
            assert checked_without_key(route) is not None, f"{route}: no scope, no check"
    assert not undecided, f"routes without a scope in transports/rest/scopes.py: {undecided}"
    # ...and the table names no route that does not exist.
    assert set(ROUTE_SCOPES) <= set(routes), set(ROUTE_SCOPES) - set(routes)
    assert set(NO_API_KEY) <= set(routes), set(NO_API_KEY) - set(routes)


def test_the_table_follows_its_rule_and_spells_out_each_exception() -> None:
    exceptions = {
        route: scope
        for route, scope in ROUTE_SCOPES.items()
        if scope is not (Scope.READ if route.startswith("GET ") else Scope.WRITE)
    }
    assert exceptions == {
        "POST /v1/events": Scope.EVENTS_SEND,
        "POST /v1/runs/{run_id}/signals/{name}": Scope.EVENTS_SEND,
        "POST /v1/workflows/validate": Scope.READ,
        "POST /v1/routing/validate": Scope.READ,
        "POST /v1/connections/validate": Scope.READ,
        "GET /v1/inbox/secret": Scope.WRITE,
        "GET /v1/keys": Scope.ADMIN,
        "POST /v1/keys": Scope.ADMIN,
        "GET /v1/keys/{key_id}": Scope.ADMIN,
        "DELETE /v1/keys/{key_id}": Scope.ADMIN,
    }


def test_an_unlisted_route_needs_admin_and_options_any_key() -> None:
    assert scope_for("POST", "/v1/something-new") is Scope.ADMIN
    assert scope_for("GET", "/v1/something-new") is Scope.ADMIN
    assert scope_for("OPTIONS", "/v1/runs") is None
    assert scope_for("HEAD", "/v1/runs") is Scope.READ
    assert scope_for("post", "/v1/events") is Scope.EVENTS_SEND


def test_every_mcp_tool_needs_the_scope_of_its_rest_call() -> None:
    for tool in TOOLS:
        assert tool.route in ROUTE_SCOPES, tool.name
        assert tool_scope(tool) is ROUTE_SCOPES[tool.route], tool.name
        assert tool.route.split(" ", 1)[1].split("{", 1)[0] in tool.description, tool.name
    by_name = {tool.name: tool_scope(tool) for tool in TOOLS}
    assert by_name["send_event"] is Scope.EVENTS_SEND
    assert by_name["send_signal"] is Scope.EVENTS_SEND
    assert by_name["validate_workflow"] is Scope.READ
    assert {name for name, scope in by_name.items() if scope is Scope.WRITE} == {
        "publish_workflow",
        "trigger_run",
        "cancel_run",
        "rerun_run",
        "route",
    }


def test_every_v1_route_refuses_a_nul_in_its_parameters() -> None:
    # docs/api.md: a NUL in any path or query parameter under /v1 is 422
    # request.invalid naming it, whoever the caller is (tenant, operator,
    # subscriber or bridge app).
    unguarded = sorted(
        route
        for route, guards in _routes().items()
        if route.split(" ", 1)[1].startswith("/v1/")
        and not route.startswith("WS ")  # a socket's credentials come in its first message
        and "refuse_nul_parameters" not in guards
    )
    assert unguarded == []
