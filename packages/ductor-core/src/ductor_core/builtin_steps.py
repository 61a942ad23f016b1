"""The specs of the built-in step types, the set they form, and `decode_args` over it.

Each spec's `check` reports what structure cannot say (one of two fields,
non-blank names, positive versions); the messages and pointers are part of the
validation corpus. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

from ductor_core.expressions import string_literal
from ductor_core.notification_fields import LABEL_RULE, URL_RULE, is_label, is_link
from ductor_core.step_args import (
    ActionArgs,
    BridgeArgs,
    DataflowArgs,
    GatherArgs,
    NotifyArgs,
    RouteArgs,
    ScatterArgs,
    StepType,
    SubworkflowArgs,
    WaitArgs,
    WaitForEventArgs,
    WaitForSignalArgs,
)
from ductor_core.step_specs import (
    ArgsCheck,
    Evaluate,
    InCoordinator,
    OnWorker,
    StepSpec,
    StepSpecs,
)

__all__ = [
    "ARGS_BY_TYPE",
    "BUILTIN_STEP_SPECS",
    "MAX_MESSAGE_NAME",
    "NAME_PATTERN",
    "StepArgs",
    "decode_args",
    "uncarried_name",
]

# --- shared checks -------------------------------------------------------------------

MAX_MESSAGE_NAME = 256
"""The longest event or signal name the API takes, so the longest a trigger or a
wait may wait for."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _unfit_name(name: str, what: str, article: str) -> str | None:
    """Why `name` breaks the API's rule for ids and names (at most 256 characters,
    no control character), calling them `what`; None when it keeps it."""
    if len(name) > MAX_MESSAGE_NAME:
        return f"is longer than {article} {what} may be ({MAX_MESSAGE_NAME})"
    if _CONTROL.search(name):
        return f"holds a control character, which no {what} may: {_show(name)}"
    return None


def uncarried_name(name: str) -> str | None:
    """Why no event or signal can carry `name` (the API refuses one over
    `MAX_MESSAGE_NAME` characters or holding a control character), or None when
    one can: a trigger or a wait on it would never be woken."""
    return _unfit_name(name, "event or signal name", "an")


def _exactly_one(a: ArgsCheck, first: str, second: str, what: str) -> None:
    if a.given(first) == a.given(second):
        a.problem(
            f"{what} needs exactly one of '{first}' or '{second}'"
            + (", not both" if a.given(first) else "")
        )


def _positive_version(a: ArgsCheck, *parts: str) -> None:
    version = a.value(*parts)
    if isinstance(version, int) and version < 1:
        a.problem(f"'{a.prefix}{'.'.join(parts)}' must be 1 or more, got {version}", *parts)


# --- DATAFLOW ------------------------------------------------------------------------

# Which fields each operation needs; the others must be left out.
_DATAFLOW_NEEDS: dict[str, tuple[str, ...]] = {
    "project": ("project",),
    "filter": ("items", "predicate"),
    "map": ("items", "expression"),
    "merge": ("sources",),
    "pick": ("source", "keys"),
}
_DATAFLOW_FIELDS = ("project", "items", "predicate", "expression", "sources", "source", "keys")


def _check_dataflow(a: ArgsCheck) -> None:
    operation = a.text("operation")
    if operation in _DATAFLOW_NEEDS:
        needs = _DATAFLOW_NEEDS[operation]
        for name in needs:
            if not a.given(name):
                a.problem(f"DATAFLOW operation '{operation}' needs '{a.prefix}{name}'", name)
        for name in _DATAFLOW_FIELDS:
            if name not in needs and a.given(name):
                a.problem(
                    f"'{a.prefix}{name}' is not used by DATAFLOW operation '{operation}'", name
                )
        for name in ("project", "sources", "keys"):
            if name in needs and a.fields.get(name) in ({}, []):
                a.problem(f"'{a.prefix}{name}' must not be empty", name)
    a.expressions("project", "items")
    a.expressions("predicate", "expression", sees=("item", "index"))
    a.expressions("source", "sources")
    keys = a.fields.get("keys")
    for j, key in enumerate(keys if isinstance(keys, list) else []):
        if not key:
            a.problem(f"'{a.prefix}keys[{j}]' is empty", "keys", j)


DATAFLOW: StepSpec[DataflowArgs] = StepSpec(
    type=StepType.DATAFLOW,
    args=DataflowArgs,
    start=InCoordinator.DATAFLOW,
    check=_check_dataflow,
    scatterable=True,
)

# --- the waits -----------------------------------------------------------------------


def _check_wait(a: ArgsCheck) -> None:
    _exactly_one(a, "duration", "until", "WAIT")
    a.duration("duration")


def _carried(a: ArgsCheck, name: str, unfit: Callable[[str], str | None] = uncarried_name) -> None:
    value = a.text(name)
    reason = None if value is None else unfit(value)
    if reason is not None:
        a.problem(f"'{a.prefix}{name}' {reason}", name)


def _check_wait_for_event(a: ArgsCheck) -> None:
    a.not_blank("event")
    _carried(a, "event")
    a.expressions("match", sees=("event",))
    a.duration("timeout")


def _check_wait_for_signal(a: ArgsCheck) -> None:
    a.not_blank("signal")
    _carried(a, "signal")
    a.duration("timeout")


WAIT: StepSpec[WaitArgs] = StepSpec(
    type=StepType.WAIT,
    args=WaitArgs,
    start=InCoordinator.WAIT,
    expressions=("until",),
    check=_check_wait,
)
WAIT_FOR_EVENT: StepSpec[WaitForEventArgs] = StepSpec(
    type=StepType.WAIT_FOR_EVENT,
    args=WaitForEventArgs,
    start=InCoordinator.WAIT_FOR_EVENT,
    check=_check_wait_for_event,
)
WAIT_FOR_SIGNAL: StepSpec[WaitForSignalArgs] = StepSpec(
    type=StepType.WAIT_FOR_SIGNAL,
    args=WaitForSignalArgs,
    start=InCoordinator.WAIT_FOR_SIGNAL,
    check=_check_wait_for_signal,
)

# --- ACTION --------------------------------------------------------------------------


def _check_action(a: ArgsCheck) -> None:
    a.not_blank("action")
    a.not_blank("connection")
    a.not_blank("operation")
    if a.given("action") and a.given("connection"):
        a.problem(
            f"an ACTION takes '{a.prefix}action' (a built-in action) or"
            f" '{a.prefix}connection' (one of the tenant's connections), not both",
            "connection",
        )
    elif not a.given("action") and not a.given("connection"):
        # At the args when they are empty or missing (then `/args/action` has no parent).
        a.problem(
            f"an ACTION needs '{a.prefix}connection' and '{a.prefix}operation'"
            f" (or '{a.prefix}action' for a built-in action)",
            *(("action",) if a.raw else ()),
        )
    elif a.given("connection"):
        if not a.given("operation"):
            a.problem(f"an ACTION through a connection needs '{a.prefix}operation'", "operation")
        if a.fields.get("params"):
            a.problem(
                f"'{a.prefix}params' is for an 'action'; a connection takes '{a.prefix}input'",
                "params",
            )
    elif a.given("action"):
        for name in ("operation", "input"):
            if a.given(name) and a.fields.get(name) != {}:
                a.problem(
                    f"'{a.prefix}{name}' is for a 'connection'; an 'action' takes"
                    f" '{a.prefix}params'",
                    name,
                )


def _action_handler(args: ActionArgs) -> str:
    return "connection" if args.connection is not None else f"action:{args.action}"


def _action_payload(args: ActionArgs, evaluate: Evaluate) -> Any:
    if args.connection is not None:
        return {
            "connection": args.connection,
            "operation": args.operation,
            "input": {key: evaluate(source) for key, source in args.input.items()},
        }
    return {
        "params": {key: evaluate(source) for key, source in args.params.items()},
        "connection": None,
    }


ACTION: StepSpec[ActionArgs] = StepSpec(
    type=StepType.ACTION,
    args=ActionArgs,
    start=OnWorker(
        handler="action",
        handler_for=_action_handler,
        payload=_action_payload,
    ),
    expressions=("params", "input"),
    check=_check_action,
    scatterable=True,
)

# --- SCATTER and GATHER --------------------------------------------------------------


def _check_scatter(a: ArgsCheck) -> None:
    _exactly_one(a, "step", "workflow", "SCATTER")
    a.expressions("items")
    a.expressions("input", sees=("item", "index"))
    if a.given("input") and a.given("step") and not a.given("workflow"):
        # a field that does nothing is refused, as an unused timeout or retry is
        a.problem(
            f"'{a.prefix}input' is each child run's input, used only with 'workflow'; "
            "a 'step' template reads 'item' and 'index' itself",
            "input",
        )
    concurrency = a.fields.get("max_concurrency")
    if isinstance(concurrency, int) and concurrency < 1:
        a.problem(
            f"'{a.prefix}max_concurrency' must be at least 1, got {concurrency}",
            "max_concurrency",
        )
    if isinstance(a.fields.get("step"), dict):
        spec = a.template_spec("step")
        if spec is not None and not spec.scatterable:
            a.problem(
                f"a SCATTER cannot run a {spec.type} per item; use one of "
                + ", ".join(a.specs.scatterable),
                "step",
                "type",
            )
        elif spec is not None:
            a.template_args("step", spec)
        a.template_limits("step")
    if isinstance(a.fields.get("workflow"), dict):
        a.slug("workflow", "family_slug")
        _positive_version(a, "workflow", "version")


def _check_gather(a: ArgsCheck) -> None:
    scatter = a.text("scatter")
    if scatter is None:
        return
    label = a.prefix + "scatter"
    kind = a.type_of(scatter)
    if kind is None:
        a.problem(f"'{label}' names no step: {_show(scatter)}", "scatter")
    elif kind != StepType.SCATTER:
        a.problem(
            f"'{label}' must name a STEP_TYPE_SCATTER step; "
            f"'{scatter}' is {kind or 'of no known type'}",
            "scatter",
        )
    elif a.ref is not None and not a.precedes(scatter):
        a.problem(
            f"the SCATTER '{scatter}' must come before this GATHER "
            "(a path of edges must lead from it to here)",
            "scatter",
        )


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


SCATTER: StepSpec[ScatterArgs] = StepSpec(
    type=StepType.SCATTER,
    args=ScatterArgs,
    start=InCoordinator.SCATTER,
    check=_check_scatter,
)
GATHER: StepSpec[GatherArgs] = StepSpec(
    type=StepType.GATHER,
    args=GatherArgs,
    start=InCoordinator.GATHER,
    check=_check_gather,
)

# --- SUBWORKFLOW and BRIDGE ----------------------------------------------------------


def _check_subworkflow(a: ArgsCheck) -> None:
    a.slug("family_slug")
    _positive_version(a, "version")


def _check_bridge(a: ArgsCheck) -> None:
    a.not_blank("app_id")
    a.not_blank("workflow")


SUBWORKFLOW: StepSpec[SubworkflowArgs] = StepSpec(
    type=StepType.SUBWORKFLOW,
    args=SubworkflowArgs,
    start=InCoordinator.SUBWORKFLOW,
    expressions=("input",),
    check=_check_subworkflow,
)
BRIDGE: StepSpec[BridgeArgs] = StepSpec(
    type=StepType.BRIDGE,
    args=BridgeArgs,
    start=OnWorker(handler="bridge"),
    expressions=("input",),
    check=_check_bridge,
    scatterable=True,
)

# --- ROUTE and NOTIFY ----------------------------------------------------------------


def _routing_id(name: str) -> str | None:
    # POST /v1/route refuses such a kind or pool: the step could only ever fail.
    return _unfit_name(name, "routing id", "a")


def _check_route(a: ArgsCheck) -> None:
    a.not_blank("kind")
    a.not_blank("pool")
    _carried(a, "kind", _routing_id)
    _carried(a, "pool", _routing_id)
    a.expressions("attributes", "price")
    if a.given("timeout") and a.fields.get("await_completion") is not True:
        a.problem(f"'{a.prefix}timeout' only applies with 'await_completion': true", "timeout")
    a.duration("timeout")


def _route_payload(args: RouteArgs, evaluate: Evaluate) -> Any:
    return {
        "kind": args.kind,
        "attributes": {key: evaluate(source) for key, source in args.attributes.items()},
        "pool": args.pool,
        "price": None if args.price is None else evaluate(args.price),
        "await_completion": args.await_completion,
    }


ROUTE: StepSpec[RouteArgs] = StepSpec(
    type=StepType.ROUTE,
    args=RouteArgs,
    start=OnWorker(
        handler="route", payload=_route_payload, attempt_timeout=lambda args: args.timeout
    ),
    check=_check_route,
    scatterable=True,
)
MAX_CTAS = 2
"""The most calls to action one notification carries."""

NAME_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
"""What a feed or a CTA action name looks like (the inbox's REST API checks the
same; match it with `fullmatch`)."""


def _check_notify(a: ArgsCheck) -> None:
    a.not_blank("recipients")
    a.not_blank("title")
    feed = a.text("feed")
    if feed is not None and not NAME_PATTERN.fullmatch(feed):
        a.problem(
            f"'{a.prefix}feed' must be 1-64 letters, digits or _.:-, got {_show(feed)}", "feed"
        )
    avatar = a.text("avatar")
    if avatar is not None:
        _check_literal(a, avatar, is_link, URL_RULE, "avatar")
    ctas = a.fields.get("ctas")
    actions = 0
    if isinstance(ctas, list):
        if len(ctas) > MAX_CTAS:
            a.problem(f"a notification has at most {MAX_CTAS} CTAs, got {len(ctas)}", "ctas")
        for j, cta in enumerate(ctas):
            if not isinstance(cta, dict):
                continue
            actions += _check_cta(a, j, cta)
    if a.fields.get("await_action") is True and actions == 0:
        a.problem(
            f"'{a.prefix}await_action' needs at least one CTA with an 'action'", "await_action"
        )
    if a.given("timeout") and a.fields.get("await_action") is not True:
        a.problem(f"'{a.prefix}timeout' only applies with 'await_action': true", "timeout")
    a.duration("timeout")
    email = a.fields.get("email")
    if isinstance(email, dict):
        connection = email.get("connection")
        if isinstance(connection, str) and not connection.strip():
            a.problem(f"'{a.prefix}email.connection' must not be blank", "email", "connection")
        subject = email.get("subject")
        if isinstance(subject, str):
            a.expression(subject, "email", "subject")


def _check_cta(a: ArgsCheck, j: int, cta: dict[str, Any]) -> int:
    label, url, action = cta.get("label"), cta.get("url"), cta.get("action")
    if isinstance(label, str):
        a.expression(label, "ctas", j, "label")
        _check_literal(a, label, is_label, LABEL_RULE, "ctas", j, "label")
    if (url is None) == (action is None):
        a.problem(f"'{a.prefix}ctas[{j}]' needs exactly one of 'url' or 'action'", "ctas", j)
    if isinstance(url, str):
        a.expression(url, "ctas", j, "url")
        _check_literal(a, url, is_link, URL_RULE, "ctas", j, "url")
    for name in ("action", "signal", "event"):
        value = cta.get(name)
        if isinstance(value, str) and not NAME_PATTERN.fullmatch(value):
            a.problem(
                f"'{a.prefix}ctas[{j}].{name}' must be 1-64 letters, digits or _.:-, "
                f"got {_show(value)}",
                "ctas",
                j,
                name,
            )
        if name != "action" and value is not None and action is None:
            a.problem(f"'{a.prefix}ctas[{j}].{name}' only applies to an action CTA", "ctas", j)
    return 1 if isinstance(action, str) else 0


def _check_literal(
    a: ArgsCheck, source: str, ok: Callable[[str], bool], rule: str, *parts: str | int
) -> None:
    # A string literal is judged now; any other expression's value when the step
    # runs (notify.bad_value), by the same rule.
    value = string_literal(source)
    if value is not None and not ok(value):
        name = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)[1:]
        a.problem(f"'{a.prefix}{name}' {rule}, got {_show(value)}", *parts)


NOTIFY: StepSpec[NotifyArgs] = StepSpec(
    type=StepType.NOTIFY,
    args=NotifyArgs,
    start=InCoordinator.NOTIFY,
    expressions=("recipients", "title", "body", "data", "avatar"),
    check=_check_notify,
)

# --- the set -------------------------------------------------------------------------

BUILTIN_STEP_SPECS = StepSpecs(
    [
        DATAFLOW,
        WAIT,
        WAIT_FOR_EVENT,
        WAIT_FOR_SIGNAL,
        ACTION,
        SCATTER,
        GATHER,
        SUBWORKFLOW,
        BRIDGE,
        ROUTE,
        NOTIFY,
    ]
)
"""Every built-in step type; `validate_definition`, `start_run` and `tick` use it by default."""

StepArgs = (
    DataflowArgs
    | WaitArgs
    | WaitForEventArgs
    | WaitForSignalArgs
    | ActionArgs
    | ScatterArgs
    | GatherArgs
    | SubworkflowArgs
    | BridgeArgs
    | RouteArgs
    | NotifyArgs
)
"""The args of a built-in step type; another type's args are any `msgspec.Struct`."""

ARGS_BY_TYPE: dict[StepType, type[StepArgs]] = {
    StepType(spec.type): spec.args for spec in BUILTIN_STEP_SPECS
}
"""The args struct of each built-in step type (read from its spec)."""


def decode_args(
    step_type: str, args: dict[str, Any], *, specs: StepSpecs | None = None
) -> msgspec.Struct:
    """Convert a step's raw `args` into the typed struct for `step_type`.

    Args:
        step_type: a wire name (a `StepType` is one).
        args: the raw args.
        specs: the step types to look it up in; the built-in ones if None.

    Raises:
        DefinitionError: code `definition.bad_args`, naming the field at fault,
            or `definition.unknown_step_type`.
    """
    spec = (BUILTIN_STEP_SPECS if specs is None else specs).require(step_type)
    result: msgspec.Struct = spec.decode(args)
    return result
