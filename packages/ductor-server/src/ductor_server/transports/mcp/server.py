"""The MCP server of one process: its tools and resources over the shared services.

Handlers find the services in the server's lifespan context and the caller
(tenant and scopes) in the HTTP request's scope, where `McpEndpoint` put it
after checking the API key. A tool needs the scope of the REST call it mirrors
(`tools/list` shows only the tools the key may call; calling another is
`auth.forbidden`), and the resources need `read`. A service error becomes a tool
error result carrying the REST error body (`{code, message, details}`), never a
protocol error; malformed arguments are `request.invalid` naming the argument.
No HTTP here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    CallToolResult,
    ContentBlock,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ListToolsResult,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    ReadResourceResult,
    Resource,
    ResourceTemplate,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)

from ductor_core.errors import DuctorError
from ductor_server.errors import RequestInvalid, bounded
from ductor_server.services import Answer, Services
from ductor_server.services.keys import Caller, Scope
from ductor_server.services.tools import (
    TOOLS,
    TOOLS_BY_NAME,
    ToolSpec,
    builtins,
    decode_arguments,
    error_body,
    input_schema,
)
from ductor_server.transports.mcp.endpoint import CALLER_KEY
from ductor_server.transports.rest.bodies import path_version
from ductor_server.transports.rest.errors import ApiError
from ductor_server.transports.rest.scopes import scope_for

log = logging.getLogger("ductor_server.transports.mcp")


SERVER_NAME = "ductor"

WORKFLOW_URI = "ductor://workflows/{family_slug}"
VERSION_URI = "ductor://workflows/{family_slug}/versions/{version}"
HISTORY_URI = "ductor://runs/{run_id}/history"
_WORKFLOW = re.compile(r"ductor://workflows/([^/]+)")
_VERSION = re.compile(r"ductor://workflows/([^/]+)/versions/([^/]+)")
_HISTORY = re.compile(r"ductor://runs/([^/]+)/history")


def _text(value: Any) -> list[ContentBlock]:
    return [TextContent(text=json.dumps(value, ensure_ascii=False))]


def tool_error(body: dict[str, Any]) -> CallToolResult:
    """A tool result that failed with the REST error body `body` (its message and
    details `bounded`)."""
    message, details = bounded(body["message"], body.get("details"))
    body = {**body, "message": message}
    if details is not None:
        body["details"] = details
    return CallToolResult(content=_text(body), structured_content=body, is_error=True)


def tool_result(value: Any) -> CallToolResult:
    """A tool's answer: the view as structured content and as JSON text. A mutation's
    `_meta` tells what it did (`ductor/status`, the REST status) and whether it was
    a remembered answer (`ductor/replayed`)."""
    meta: dict[str, Any] | None = None
    if isinstance(value, Answer):
        meta = {"ductor/status": int(value.outcome), "ductor/replayed": value.replayed}
        value = value.value
    body = builtins(value)
    return CallToolResult(content=_text(body), structured_content=body, _meta=meta)


def tool_definition(tool: ToolSpec) -> Tool:
    """How `tools/list` describes `tool`."""
    return Tool(
        name=tool.name,
        title=tool.title,
        description=tool.description,
        input_schema=input_schema(tool),
        annotations=ToolAnnotations(
            title=tool.title,
            read_only_hint=not tool.mutates,
            destructive_hint=tool.destructive,
            idempotent_hint=not tool.mutates,
            open_world_hint=False,
        ),
    )


def caller_of(ctx: ServerRequestContext[Services, Any]) -> Caller:
    """The caller `McpEndpoint` authenticated for this request.

    Raises:
        MCPError: the request came by another way than the endpoint (a bug).
    """
    request = ctx.request
    state = getattr(request, "scope", {}).get("state") or {}
    caller = state.get(CALLER_KEY)
    if not isinstance(caller, Caller):
        raise MCPError(INTERNAL_ERROR, "the request carries no authenticated caller")
    return caller


def tool_scope(tool: ToolSpec) -> Scope:
    """The scope a key needs to call `tool`: that of the REST call it mirrors."""
    method, _, path = tool.route.partition(" ")
    return scope_for(method, path) or Scope.ADMIN


def reader_of(ctx: ServerRequestContext[Services, Any]) -> str:
    """The tenant of a caller allowed to read resources.

    Raises:
        MCPError: the key lacks the `read` scope (its data is the `auth.forbidden` body).
    """
    caller = caller_of(ctx)
    try:
        caller.require(Scope.READ)
    except DuctorError as error:
        body = error_body(error)
        raise MCPError(INVALID_PARAMS, f"{body['code']}: {body['message']}", body) from None
    return caller.tenant_id


def resource_parameter(name: str, value: str) -> str:
    """A parameter of a resource URI, refused as REST refuses a path parameter
    holding a NUL character (no store can look it up).

    Raises:
        RequestInvalid: `details.path` names the parameter.
    """
    if "\x00" in value:
        reason = "contains a NUL character"
        raise RequestInvalid(
            f"parameter {name!r} {reason}", details={"path": name, "reason": reason}
        )
    return value


def build_server(
    version: str, lifespan: Callable[[Server[Services]], AbstractAsyncContextManager[Services]]
) -> Server[Services]:
    """The MCP server: the tools of `TOOLS`, the definition and history resources.

    Args:
        version: the server version it announces.
        lifespan: yields the process's `Services` (what every handler calls).
    """
    definitions = [tool_definition(tool) for tool in TOOLS]
    schemas = {tool.name: tool.input_schema for tool in definitions}

    async def list_tools(
        ctx: ServerRequestContext[Services, Any], _: PaginatedRequestParams | None
    ) -> ListToolsResult:
        caller = caller_of(ctx)
        return ListToolsResult(
            tools=[d for d, t in zip(definitions, TOOLS, strict=True) if caller.may(tool_scope(t))]
        )

    async def on_call_tool(
        ctx: ServerRequestContext[Services, Any], params: CallToolRequestParams
    ) -> CallToolResult:
        caller = caller_of(ctx)
        tool = TOOLS_BY_NAME.get(params.name)
        if tool is None:
            # The tools this key may call, as `tools/list` shows them.
            callable_tools = sorted(t.name for t in TOOLS if caller.may(tool_scope(t)))
            return tool_error(
                {
                    "code": "request.invalid",
                    "message": f"no tool named {params.name!r}",
                    "details": {"tool": params.name, "tools": callable_tools},
                }
            )
        try:
            caller.require(tool_scope(tool))
            args = decode_arguments(params.arguments, tool.arguments)
            value = await tool.call(ctx.lifespan_context, caller.tenant_id, args)
        except DuctorError as error:
            return tool_error(error_body(error))
        except Exception:
            log.exception("tool %s failed", tool.name)
            return tool_error({"code": "internal", "message": "internal server error"})
        return tool_result(value)

    async def list_resources(
        ctx: ServerRequestContext[Services, Any], _: PaginatedRequestParams | None
    ) -> ListResourcesResult:
        families = await ctx.lifespan_context.workflows.families(reader_of(ctx))
        return ListResourcesResult(
            resources=[
                Resource(
                    uri=WORKFLOW_URI.format(family_slug=family.family_slug),
                    name=family.family_slug,
                    title=family.title or family.family_slug,
                    description="The workflow family: its latest definition and versions.",
                    mime_type="application/json",
                )
                for family in families
            ]
        )

    async def list_templates(
        ctx: ServerRequestContext[Services, Any], _: PaginatedRequestParams | None
    ) -> ListResourceTemplatesResult:
        return ListResourceTemplatesResult(
            resource_templates=[
                ResourceTemplate(
                    uri_template=WORKFLOW_URI,
                    name="workflow",
                    description="A workflow family: its latest definition and versions.",
                    mime_type="application/json",
                ),
                ResourceTemplate(
                    uri_template=VERSION_URI,
                    name="workflow-version",
                    description="One published version of a workflow, with its definition.",
                    mime_type="application/json",
                ),
                ResourceTemplate(
                    uri_template=HISTORY_URI,
                    name="run-history",
                    description="A run's append-only history, oldest first.",
                    mime_type="application/json",
                ),
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Services, Any], params: ReadResourceRequestParams
    ) -> ReadResourceResult:
        uri = str(params.uri)
        services, tenant_id = ctx.lifespan_context, reader_of(ctx)
        value: Any
        try:
            if match := _VERSION.fullmatch(uri):
                slug = resource_parameter("family_slug", match.group(1))
                version = path_version(resource_parameter("version", match.group(2)))
                value = await services.workflows.version(tenant_id, slug, version)
            elif match := _WORKFLOW.fullmatch(uri):
                slug = resource_parameter("family_slug", match.group(1))
                value = await services.workflows.family(tenant_id, slug)
            elif match := _HISTORY.fullmatch(uri):
                run_id = resource_parameter("run_id", match.group(1))
                value = {"items": await services.runs.history(tenant_id, run_id)}
            else:
                raise ApiError(
                    f"no resource at {uri!r}",
                    code="not_found",
                    details={"uri": uri, "templates": [WORKFLOW_URI, VERSION_URI, HISTORY_URI]},
                )
        except DuctorError as error:
            body = error_body(error)
            raise MCPError(INVALID_PARAMS, f"{body['code']}: {body['message']}", body) from None
        return ReadResourceResult(
            contents=[
                TextResourceContents(
                    uri=uri,
                    mime_type="application/json",
                    text=json.dumps(builtins(value), ensure_ascii=False),
                )
            ]
        )

    lookup: Callable[[str], dict[str, Any] | None] = schemas.get
    return Server(
        SERVER_NAME,
        version=version,
        title="Ductor",
        instructions="Ductor's workflows, runs, events, routing decisions, balances and "
        "receipts, for the tenant of the API key. Tool errors carry Ductor's error body.",
        lifespan=lifespan,
        get_tool_input_schema=lookup,
        on_list_tools=list_tools,
        on_call_tool=on_call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
    )


__all__ = [
    "HISTORY_URI",
    "VERSION_URI",
    "WORKFLOW_URI",
    "build_server",
    "caller_of",
    "decode_arguments",
    "resource_parameter",
    "tool_definition",
    "tool_error",
    "tool_result",
    "tool_scope",
]
