"""The tools agents use: one argument struct and one call per tool, each a thin use
of the same service function the REST route of the same name calls. The MCP
server (`transports.mcp`) and the chat agent (`services.agent`) both serve
exactly this table, so the two can never offer different tools or schemas.

A tool's input schema is the JSON schema msgspec makes from its argument struct
(the `definition` of `validate_workflow` and `publish_workflow` is decoded as any
JSON value, so validation reports every problem at once, and described as a
`WorkflowDefinition`). `decode_arguments` holds arguments to the limits of a
REST body. Nothing here knows about HTTP, sessions or MCP messages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from ductor_core.definitions import WorkflowDefinition
from ductor_core.errors import DuctorError
from ductor_server.errors import RequestInvalid, shown
from ductor_server.services.idempotency import MAX_KEY_LENGTH, Answer
from ductor_server.services.json_limits import (
    MAX_DEPTH,
    check_json_limits,
    nesting_depth,
    too_deep_message,
    validation_path,
)
from ductor_server.services.routing import RouteBody
from ductor_server.services.runs import MAX_CANCEL_REASON, MAX_NAME_LENGTH

if TYPE_CHECKING:
    # The table is called with the process's `Services`, which holds the agent that
    # serves this table: a name for the type checker only, no import cycle.
    from ductor_server.services import Services

INT64_MAX = 2**63 - 1

IdempotencyKey = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        pattern=r"\S",
        description="Makes the call idempotent: a repeat with the same key and arguments "
        "gets the first answer again (as REST's Idempotency-Key header).",
    ),
]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_LENGTH)]
"""An id or name: as long as any REST keeps (an account code, an event's name and id,
a signal's name, a worker), so a tool reaches whatever REST made."""
Slug = Annotated[str, msgspec.Meta(min_length=1, max_length=255, description="The family slug.")]
Version = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]


class _Args(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of tool arguments: an unknown argument is an error, not ignored."""


class NoArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tool without arguments."""


class GetWorkflowArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`get_workflow`: a family (its latest definition and versions), or one version."""

    family_slug: Slug
    version: Annotated[Version, msgspec.Meta(description="One published version.")] | None = None


class ValidateArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`validate_workflow`: the definition to check."""

    definition: Any


class PublishArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`publish_workflow`: the definition to publish."""

    definition: Any
    idempotency_key: IdempotencyKey | None = None


class _DefinitionDoc(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How `validate_workflow` describes its argument."""

    definition: WorkflowDefinition


class _PublishDoc(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How `publish_workflow` describes its arguments."""

    definition: WorkflowDefinition
    idempotency_key: IdempotencyKey | None = None


class TriggerRunArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`trigger_run`: start a run of a published family (latest version if none)."""

    family_slug: Slug
    version: Version | None = None
    input: Any = None
    idempotency_key: IdempotencyKey | None = None


class RunArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A tool about one run."""

    run_id: Id


class CancelRunArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`cancel_run`: the run and an optional reason, kept in its history."""

    run_id: Id
    reason: Annotated[str, msgspec.Meta(max_length=MAX_CANCEL_REASON)] = ""
    idempotency_key: IdempotencyKey | None = None


class SendEventArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`send_event`: a named event; a repeated `id` is a duplicate."""

    name: Id
    data: Any = None
    id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class SendSignalArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`send_signal`: a named signal to one run, with a payload and an optional dedupe id."""

    run_id: Id
    name: Id
    payload: Any = None
    id: Id | None = None
    idempotency_key: IdempotencyKey | None = None


class RouteArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`route`: the routable (the body of `POST /v1/route`)."""

    routable: RouteBody
    idempotency_key: IdempotencyKey | None = None


class DecisionArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`get_decision`: one stored decision."""

    decision_id: Id


class AccountArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`get_account`: one ledger account by code."""

    code: Id


class ListReceiptsArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`list_receipts`: receipts newest first, filtered and paged as REST's."""

    subject: Id | None = None
    kind: Id | None = None
    cursor: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 50


class ReceiptArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`get_receipt`: one signed receipt."""

    receipt_id: Id


class ListRunsArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`list_runs`: runs newest first, filtered and paged as REST's."""

    status: (
        Annotated[
            str,
            msgspec.Meta(
                max_length=64,
                description="RUN_STATUS_RUNNING, RUN_STATUS_SUCCEEDED, RUN_STATUS_FAILED or "
                "RUN_STATUS_CANCELLED.",
            ),
        ]
        | None
    ) = None
    family_slug: Slug | None = None
    cursor: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=500)] = 50


class RerunArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`rerun_run`: start a new run with an ended run's family, version and input."""

    run_id: Id
    latest: Annotated[
        bool, msgspec.Meta(description="Run the family's latest version instead.")
    ] = False
    idempotency_key: IdempotencyKey | None = None


class ListAssignmentsArgs(_Args, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`list_assignments`: assignments by routable, worker and status, oldest first."""

    routable_id: Id | None = None
    worker: Id | None = None
    status: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    after: Id | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=1000)] = 100


Call = Callable[["Services", str, Any], Awaitable[Any]]
"""A tool's body: (services, tenant, decoded arguments) -> a view or an `Answer`."""


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """One MCP tool.

    Attributes:
        name: the tool's name.
        route: the REST call it mirrors (`"METHOD /path/template"`); a caller's key
            needs the scope that call needs (`transports/rest/scopes.py`).
        title: a short human title.
        description: what it does, and the REST call it mirrors.
        arguments: the struct its arguments are decoded into.
        call: what it does with them.
        documented_as: the struct its input schema is made from (`arguments` if None).
        mutates: it changes something (it then takes `idempotency_key`).
        destructive: it may end or undo something.
    """

    name: str
    route: str
    title: str
    description: str
    arguments: type[_Args]
    call: Call
    documented_as: type[_Args] | None = None
    mutates: bool = False
    destructive: bool = False


def _items(values: list[Any]) -> dict[str, list[Any]]:
    # A tool's structured result is an object: lists are given under `items`.
    return {"items": values}


async def _list_workflows(services: Services, tenant_id: str, _: NoArgs) -> Any:
    return _items(await services.workflows.families(tenant_id))


async def _get_workflow(services: Services, tenant_id: str, args: GetWorkflowArgs) -> Any:
    if args.version is None:
        return await services.workflows.family(tenant_id, args.family_slug)
    return await services.workflows.version(tenant_id, args.family_slug, args.version)


async def _validate(services: Services, tenant_id: str, args: ValidateArgs) -> Any:
    return await services.workflows.validate(tenant_id, args.definition)


async def _publish(services: Services, tenant_id: str, args: PublishArgs) -> Answer[Any]:
    return await services.workflows.publish(
        tenant_id, args.definition, idempotency_key=args.idempotency_key
    )


async def _trigger(services: Services, tenant_id: str, args: TriggerRunArgs) -> Answer[Any]:
    return await services.runs.trigger(
        tenant_id, args.family_slug, args.version, args.input, idempotency_key=args.idempotency_key
    )


async def _get_run(services: Services, tenant_id: str, args: RunArgs) -> Any:
    return await services.runs.get(tenant_id, args.run_id)


async def _history(services: Services, tenant_id: str, args: RunArgs) -> Any:
    return _items(await services.runs.history(tenant_id, args.run_id))


async def _send_event(services: Services, tenant_id: str, args: SendEventArgs) -> Answer[Any]:
    return await services.events.send(
        tenant_id, args.name, args.data, args.id, idempotency_key=args.idempotency_key
    )


async def _send_signal(services: Services, tenant_id: str, args: SendSignalArgs) -> Answer[Any]:
    return await services.runs.signal(
        tenant_id,
        args.run_id,
        args.name,
        args.payload,
        args.id,
        idempotency_key=args.idempotency_key,
    )


async def _cancel(services: Services, tenant_id: str, args: CancelRunArgs) -> Answer[Any]:
    return await services.runs.cancel(
        tenant_id, args.run_id, args.reason, idempotency_key=args.idempotency_key
    )


async def _route(services: Services, tenant_id: str, args: RouteArgs) -> Answer[Any]:
    return await services.routing.route(
        tenant_id, args.routable, idempotency_key=args.idempotency_key
    )


async def _get_decision(services: Services, tenant_id: str, args: DecisionArgs) -> Any:
    return await services.routing.get_decision(tenant_id, args.decision_id)


async def _list_accounts(services: Services, tenant_id: str, _: NoArgs) -> Any:
    return _items(await services.ledger.list_accounts(tenant_id))


async def _get_account(services: Services, tenant_id: str, args: AccountArgs) -> Any:
    return await services.ledger.get_account(tenant_id, args.code)


async def _list_receipts(services: Services, tenant_id: str, args: ListReceiptsArgs) -> Any:
    return await services.receipts.list(
        tenant_id, subject=args.subject, kind=args.kind, cursor=args.cursor, limit=args.limit
    )


async def _get_receipt(services: Services, tenant_id: str, args: ReceiptArgs) -> Any:
    return await services.receipts.get(tenant_id, args.receipt_id)


async def _list_runs(services: Services, tenant_id: str, args: ListRunsArgs) -> Any:
    return await services.runs.page(
        tenant_id,
        status=args.status,
        family_slug=args.family_slug,
        cursor=args.cursor,
        limit=args.limit,
    )


async def _rerun(services: Services, tenant_id: str, args: RerunArgs) -> Answer[Any]:
    return await services.runs.rerun(
        tenant_id, args.run_id, latest=args.latest, idempotency_key=args.idempotency_key
    )


async def _list_assignments(services: Services, tenant_id: str, args: ListAssignmentsArgs) -> Any:
    return _items(
        await services.routing.list_assignments(
            tenant_id,
            routable_id=args.routable_id,
            worker=args.worker,
            status=args.status,
            after=args.after,
            limit=args.limit,
        )
    )


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="list_workflows",
        route="GET /v1/workflows",
        title="List workflows",
        description="Every workflow family of the tenant (GET /v1/workflows), under `items`.",
        arguments=NoArgs,
        call=_list_workflows,
    ),
    ToolSpec(
        name="get_workflow",
        route="GET /v1/workflows/{slug}",
        title="Get a workflow",
        description="A family with its latest definition and versions (GET "
        "/v1/workflows/{slug}), or one published version with `version`.",
        arguments=GetWorkflowArgs,
        call=_get_workflow,
    ),
    ToolSpec(
        name="validate_workflow",
        route="POST /v1/workflows/validate",
        title="Validate a definition",
        description="Check a definition without publishing it (POST /v1/workflows/validate): "
        "`{valid, problems[]}`, each problem with a JSON pointer.",
        arguments=ValidateArgs,
        documented_as=_DefinitionDoc,
        call=_validate,
    ),
    ToolSpec(
        name="publish_workflow",
        route="POST /v1/workflows",
        title="Publish a definition",
        description="Publish a definition as a new immutable version (POST /v1/workflows); "
        "an invalid one is refused with `definition.invalid` and every problem.",
        arguments=PublishArgs,
        documented_as=_PublishDoc,
        call=_publish,
        mutates=True,
    ),
    ToolSpec(
        name="trigger_run",
        route="POST /v1/runs",
        title="Trigger a run",
        description="Start a run of a published family, latest version unless `version` "
        "(POST /v1/runs).",
        arguments=TriggerRunArgs,
        call=_trigger,
        mutates=True,
    ),
    ToolSpec(
        name="get_run",
        route="GET /v1/runs/{run_id}",
        title="Get a run",
        description="A run: status, input, output, error and every step's state "
        "(GET /v1/runs/{id}).",
        arguments=RunArgs,
        call=_get_run,
    ),
    ToolSpec(
        name="list_runs",
        route="GET /v1/runs",
        title="List runs",
        description="Runs newest first, filtered by `status` (e.g. RUN_STATUS_FAILED) and "
        "`family_slug`, paged with `cursor` (GET /v1/runs): `{items, next_cursor}`.",
        arguments=ListRunsArgs,
        call=_list_runs,
    ),
    ToolSpec(
        name="get_run_history",
        route="GET /v1/runs/{run_id}/history",
        title="Get a run's history",
        description="The run's append-only history, oldest first (GET /v1/runs/{id}/history), "
        "under `items`.",
        arguments=RunArgs,
        call=_history,
    ),
    ToolSpec(
        name="send_event",
        route="POST /v1/events",
        title="Send an event",
        description="Accept a named event: starts the runs it triggers and wakes runs "
        "waiting on it (POST /v1/events). A repeated `id` is a duplicate.",
        arguments=SendEventArgs,
        call=_send_event,
        mutates=True,
    ),
    ToolSpec(
        name="send_signal",
        route="POST /v1/runs/{run_id}/signals/{name}",
        title="Send a signal",
        description="Send a named signal to a run (POST /v1/runs/{id}/signals/{name}).",
        arguments=SendSignalArgs,
        call=_send_signal,
        mutates=True,
    ),
    ToolSpec(
        name="cancel_run",
        route="POST /v1/runs/{run_id}/cancel",
        title="Cancel a run",
        description="Ask for a run and its children to be cancelled on its next tick "
        "(POST /v1/runs/{id}/cancel).",
        arguments=CancelRunArgs,
        call=_cancel,
        mutates=True,
        destructive=True,
    ),
    ToolSpec(
        name="rerun_run",
        route="POST /v1/runs/{run_id}/rerun",
        title="Re-run a run",
        description="Start a new run with an ended run's family, version (the latest with "
        "`latest`) and input (POST /v1/runs/{id}/rerun); the new run names the old one in "
        "`rerun_of`.",
        arguments=RerunArgs,
        call=_rerun,
        mutates=True,
    ),
    ToolSpec(
        name="route",
        route="POST /v1/route",
        title="Route a routable",
        description="Run Validate, Enrich, Filter, Select, Assign on a routable (POST "
        "/v1/route): the decision, its explanation and its assignment.",
        arguments=RouteArgs,
        call=_route,
        mutates=True,
    ),
    ToolSpec(
        name="get_decision",
        route="GET /v1/decisions/{decision_id}",
        title="Get a routing decision",
        description="A stored routing decision with its explanation (GET /v1/decisions/{id}).",
        arguments=DecisionArgs,
        call=_get_decision,
    ),
    ToolSpec(
        name="list_assignments",
        route="GET /v1/assignments",
        title="List assignments",
        description="Assignments by `routable_id` (e.g. a lead's id), `worker` and `status`, "
        "oldest first (GET /v1/assignments), under `items`; each names its `decision_id`.",
        arguments=ListAssignmentsArgs,
        call=_list_assignments,
    ),
    ToolSpec(
        name="list_accounts",
        route="GET /v1/accounts",
        title="List account balances",
        description="Every ledger account with `balance`, `pending` and `available` in "
        "micros (GET /v1/accounts), under `items`.",
        arguments=NoArgs,
        call=_list_accounts,
    ),
    ToolSpec(
        name="get_account",
        route="GET /v1/accounts/{code}",
        title="Get an account balance",
        description="One ledger account with its balances (GET /v1/accounts/{code}).",
        arguments=AccountArgs,
        call=_get_account,
    ),
    ToolSpec(
        name="list_receipts",
        route="GET /v1/receipts",
        title="List receipts",
        description="Signed receipts newest first; `subject` (`run:ID`), `kind`, `cursor`, "
        "`limit` as GET /v1/receipts.",
        arguments=ListReceiptsArgs,
        call=_list_receipts,
    ),
    ToolSpec(
        name="get_receipt",
        route="GET /v1/receipts/{receipt_id}",
        title="Get a receipt",
        description="One signed receipt: its DSSE envelope, the decoded receipt, the key id "
        "and the digest (GET /v1/receipts/{id}).",
        arguments=ReceiptArgs,
        call=_get_receipt,
    ),
)
"""Every tool, in the order MCP's `tools/list` gives them."""

TOOLS_BY_NAME: dict[str, ToolSpec] = {tool.name: tool for tool in TOOLS}
"""The tools by name."""


def input_schema(tool: ToolSpec) -> dict[str, Any]:
    """The JSON schema of `tool`'s arguments: an object, its nested types under `$defs`."""
    documented = tool.documented_as or tool.arguments
    (_,), components = msgspec.json.schema_components([documented], ref_template="#/$defs/{name}")
    schema = dict(components.pop(documented.__name__))
    schema.pop("title", None)
    schema.pop("description", None)
    schema["additionalProperties"] = False
    if components:
        schema["$defs"] = components
    return schema


_FIELD = re.compile(r"field `([^`]*)`")
_SURROGATE = re.compile("[\ud800-\udfff]")


class ToolError(RequestInvalid):
    """A tool's arguments are not what it takes (`request.invalid`)."""


def decode_arguments(arguments: dict[str, Any] | None, into: type[Any]) -> Any:
    """Decode a tool's arguments strictly into its argument struct.

    Raises:
        ToolError: `request.invalid` naming the argument (`details.argument`), its
            path and why; also for nesting deeper than the REST limit, an integer
            outside 64 bits or a NUL character.
    """
    try:
        raw = msgspec.json.encode(arguments or {})
    except RecursionError:
        raise _too_deep(arguments) from None
    except UnicodeEncodeError:
        raw = b""  # a lone surrogate: `_not_json` finds where
    # Encoding writes NaN and the infinities as null: look where a null was written.
    if (not raw or b"null" in raw) and (found := _not_json(arguments or {})) is not None:
        path, reason = found
        raise _refused(_argument_at(path), path, reason)
    return decode_arguments_json(raw, into)


def _not_json(value: Any) -> tuple[str, str] | None:
    """The path of the first number or string in `value` (arguments a JSON-RPC parser
    decoded) that JSON text cannot hold, and why: NaN, an infinity (also what a
    literal like 1e999 became), a lone surrogate. None if there is none. Iterative."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return path, "number out of range (NaN or infinite)"
        elif isinstance(item, str):
            if _SURROGATE.search(item):
                return path, "string holds a lone surrogate (not valid Unicode)"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and _SURROGATE.search(key):
                    return path, "key holds a lone surrogate (not valid Unicode)"
                stack.append((inner, f"{path}.{key}"))
        elif isinstance(item, list | tuple):
            stack.extend((inner, f"{path}[{i}]") for i, inner in reversed(list(enumerate(item))))
    return None


def decode_arguments_json(raw: bytes, into: type[Any]) -> Any:
    """`decode_arguments` of arguments given as JSON text (what a model sends).

    Raises:
        ToolError: as `decode_arguments`; also for text that is not JSON.
    """
    try:
        value = msgspec.json.decode(raw, type=into)
    except RecursionError:
        raise _too_deep(_generic(raw)) from None
    except msgspec.ValidationError as exc:
        path, reason = validation_path(exc)
        argument = _argument_at(path)
        if argument is None:
            named = _FIELD.search(reason)
            argument = named.group(1) if named else None
        raise _refused(argument, path, reason) from None
    except msgspec.DecodeError as exc:
        raise ToolError(
            f"the arguments are not a JSON object: {exc}",
            details={"argument": None, "path": "$", "reason": str(exc)},
        ) from None
    try:
        check_json_limits(raw, value)
    except RequestInvalid as error:
        details = error.details if isinstance(error.details, dict) else {}
        path, reason = str(details.get("path", "$")), str(details.get("reason", error.message))
        if path == "$" and reason == too_deep_message():
            raise _too_deep(_generic(raw)) from None
        raise _refused(_argument_at(path), path, reason) from None
    return value


def _argument_at(path: str) -> str | None:
    """The argument a path inside the arguments (`$.input.a[0]`) lies in."""
    if not path.startswith("$."):
        return None
    return path[2:].split(".", 1)[0].split("[", 1)[0]


def _refused(argument: str | None, path: str, reason: str) -> ToolError:
    where = f"argument `{argument}`" if argument else "the arguments"
    return ToolError(
        f"invalid {where}: {reason}" + (f" (at {path})" if path != "$" else ""),
        details={"argument": argument, "path": path, "reason": reason},
    )


def _generic(raw: bytes) -> Any:
    """The arguments' JSON as plain values, or None when even that nests too deep."""
    try:
        return msgspec.json.decode(raw)
    except (RecursionError, msgspec.DecodeError):
        return None


def _too_deep(arguments: Any) -> ToolError:
    """Arguments nested deeper than the REST limit, naming the argument that is."""
    argument = None
    if isinstance(arguments, dict):
        for name, value in arguments.items():
            try:  # as deep as it is inside the arguments: one level down
                deep = nesting_depth(b"[" + msgspec.json.encode(value) + b"]") > MAX_DEPTH
            except RecursionError:
                deep = True
            if deep:
                argument = str(name)
                break
    return _refused(argument, f"$.{argument}" if argument else "$", too_deep_message())


def error_body(error: DuctorError) -> dict[str, Any]:
    """The REST error body of `error`: `{code, message, details}`."""
    message, details = shown(error)
    return {"code": error.code, "message": message, "details": details}


def builtins(value: Any) -> Any:
    """A tool's answer as plain JSON values: the same JSON its REST answer has."""
    return msgspec.json.decode(msgspec.json.encode(value))


__all__ = [
    "TOOLS",
    "TOOLS_BY_NAME",
    "NoArgs",
    "ToolError",
    "ToolSpec",
    "builtins",
    "decode_arguments",
    "decode_arguments_json",
    "error_body",
    "input_schema",
]
