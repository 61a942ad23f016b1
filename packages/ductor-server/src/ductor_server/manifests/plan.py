"""The plan of an apply: what each resource of the manifests would do (create, update,
unchanged), every problem found before anything is written, and applying the plan.

One implementation for both ways in: `Target` is the server, reached over the REST
API (`manifests.rest`) or through the services (`manifests.local`). Validation is
the server's own validators; this module only maps their pointers into the files.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from ductor_core.definitions import content_hash, definition_from_obj
from ductor_core.errors import DuctorError
from ductor_routing import Pool, Worker
from ductor_server.manifests.files import Problem, Resource, escape
from ductor_server.services.routing import RulesBody

ORDER = ("Connection", "Worker", "Pool", "RuleSet", "Workflow")
"""The order resources are applied in: what others name comes first."""


class TargetError(Exception):
    """The server refused a call (its code and message)."""

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details


@dataclass(frozen=True)
class Found:
    """A problem a server validator found: a pointer into the body it was given."""

    pointer: str
    message: str
    code: str = ""


_PATH_AT = re.compile(r" - at `([^`]*)`$")
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def path_pointer(message: str, path: str | None = None) -> Found:
    """A msgspec validation message (`... - at `$.a[0]``), or a `request.invalid`
    answer's `details.path`, as a problem with a JSON pointer."""
    if path is None:
        match = _PATH_AT.search(message)
        path = match.group(1) if match else "$"
        message = message[: match.start()] if match else message
    parts = [m.group(1) or m.group(2) or "" for m in _PATH_PART.finditer(path.removeprefix("$"))]
    return Found("".join("/" + escape(p) for p in parts), message)


class Target(Protocol):
    """The server an apply reads and writes, for one tenant. Bodies and answers are
    JSON values, as the REST API has them."""

    async def workflow_hashes(self, slug: str) -> list[str]:
        """The content hash of each version of the family, oldest first ([] if none)."""
        ...

    async def validate_workflow(self, definition: Any) -> list[Found]:
        """The problems `POST /v1/workflows/validate` reports."""
        ...

    async def publish_workflow(self, definition: Any) -> tuple[int, bool]:
        """Publish; the version and whether it is new."""
        ...

    async def routing_state(self) -> tuple[list[Any], list[Any], Any]:
        """The stored workers, pools, and rule set (None when none was published)."""
        ...

    async def validate_routing(
        self, workers: list[Any], pools: list[Any], rule_set: Any
    ) -> list[Found]:
        """The problems `POST /v1/routing/validate` reports."""
        ...

    async def put_worker(self, spec: Any) -> None:
        """Create or replace a worker."""
        ...

    async def put_pool(self, spec: Any) -> None:
        """Create or replace a pool."""
        ...

    async def publish_rules(self, spec: Any) -> int:
        """Publish the rule set; its version."""
        ...

    async def connections(self) -> list[Any]:
        """The tenant's connections (views: secrets as masks)."""
        ...

    async def providers(self) -> list[Any]:
        """The providers (`GET /v1/providers`)."""
        ...

    async def validate_connection(self, body: Any) -> list[Found]:
        """The problems `POST /v1/connections/validate` reports."""
        ...

    async def create_connection(self, body: Any) -> None:
        """Create a connection."""
        ...

    async def update_connection(self, name: str, patch: Any) -> None:
        """Change a connection (`PATCH`)."""
        ...


class Action(enum.StrEnum):
    """What applying does to one resource."""

    CREATE = "create"
    UPDATE = "update"
    UNCHANGED = "unchanged"


@dataclass
class Change:
    """One resource in the plan: its action, what differs, and the body to send."""

    resource: Resource
    action: Action
    fields: tuple[str, ...] = ()
    body: Any = None

    def line(self) -> str:
        """`create    Pool/sales`, with the changed fields of an update."""
        extra = f" ({', '.join(self.fields)})" if self.fields else ""
        return f"{self.action.value:<9} {self.resource.ref}{extra}"


@dataclass
class Plan:
    """Every change, in apply order, and every problem (apply nothing if any)."""

    changes: list[Change] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def counts(self) -> dict[Action, int]:
        """How many resources each action has."""
        return {a: sum(1 for c in self.changes if c.action is a) for a in Action}


def _builtins(value: Any, into: type[Any]) -> Any:
    """`value` as the server stores it (decoded into `into`, defaults filled), or None
    when it does not fit (validation reports why)."""
    try:
        return msgspec.to_builtins(msgspec.convert(value, into))
    except (msgspec.ValidationError, TypeError):
        return None


def _diff(wanted: Mapping[str, Any], stored: Mapping[str, Any]) -> tuple[str, ...]:
    keys = sorted(set(wanted) | set(stored))
    return tuple(k for k in keys if wanted.get(k) != stored.get(k))


def _env_name(value: Any) -> str | None:
    if isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str):
        name: str = value["env"]
        return name
    return None


def _by_ref(resources: Sequence[Resource], kind: str) -> list[Resource]:
    return [r for r in resources if r.kind == kind]


async def make_plan(
    target: Target, resources: Sequence[Resource], *, environ: Mapping[str, str] | None = None
) -> Plan:
    """Validate every resource with the server's validators and diff it against what
    the server has; write nothing."""
    env = os.environ if environ is None else environ
    plan = Plan()
    changes: dict[str, list[Change]] = {kind: [] for kind in ORDER}
    try:
        await _plan_connections(target, _by_ref(resources, "Connection"), env, plan, changes)
        await _plan_routing(target, resources, plan, changes)
        new_connections = {
            c.resource.name: c.body["provider"]
            for c in changes["Connection"]
            if c.action is Action.CREATE
        }
        await _plan_workflows(
            target, _by_ref(resources, "Workflow"), new_connections, plan, changes
        )
    except TargetError as exc:
        plan.problems.append(Problem("", "", f"{exc.code}: {exc.message}"))
    plan.changes = [c for kind in ORDER for c in changes[kind]]
    return plan


async def _plan_connections(
    target: Target,
    resources: list[Resource],
    env: Mapping[str, str],
    plan: Plan,
    changes: dict[str, list[Change]],
) -> None:
    if not resources:
        return
    stored = {c["name"]: c for c in await target.connections()}
    providers = {p["name"]: p for p in await target.providers()}
    for resource in resources:
        spec = resource.spec
        problems_before = len(plan.problems)
        raw_secrets = spec.get("secrets", {})
        secrets: dict[str, Any] = {}
        if not isinstance(raw_secrets, dict):
            plan.problems.append(
                resource.problem("/secrets", "secrets must be a mapping of name to {env: VARIABLE}")
            )
            raw_secrets = {}
        current = stored.get(resource.name)
        have = set(current["secrets"]) if current is not None else set()
        for key, value in raw_secrets.items():
            at = f"/secrets/{escape(key)}"
            if value is None:
                continue  # left unset on purpose
            variable = _env_name(value)
            if variable is None:
                plan.problems.append(
                    resource.problem(
                        at,
                        "a secret is never written in a file: name an environment variable"
                        " ({env: VARIABLE}) or leave it null",
                    )
                )
                continue
            if not variable.strip():
                plan.problems.append(
                    resource.problem(
                        at, "'env' must name an environment variable, got an empty string"
                    )
                )
                continue
            if variable in env:
                if key not in have:
                    secrets[key] = env[variable]
            elif key not in have:
                plan.problems.append(
                    resource.problem(at, f"environment variable {variable} is not set")
                )
        body = {k: v for k, v in spec.items() if k != "secrets"}
        provider = (
            providers.get(body.get("provider")) if isinstance(body.get("provider"), str) else None
        )
        if provider is not None and current is None:
            required = provider.get("secrets", {}).get("required", [])
            for name in required:
                if name not in raw_secrets or raw_secrets[name] is None:
                    plan.problems.append(
                        resource.problem(
                            f"/secrets/{escape(name)}",
                            f"provider {provider['name']!r} needs secret {name!r}: name its"
                            " environment variable ({env: VARIABLE})",
                        )
                    )
        # An update's secrets are checked with those stored, which only the write sees.
        checked = {**body, "secrets": secrets if current is None else {}}
        for found in await target.validate_connection(checked):
            plan.problems.append(resource.problem(found.pointer, found.message))
        if current is not None and body.get("provider") != current["provider"]:
            plan.problems.append(
                resource.problem(
                    "/provider",
                    f"connection {resource.name!r} uses provider {current['provider']!r}: a"
                    " connection's provider cannot change (delete it and apply again)",
                )
            )
        if len(plan.problems) > problems_before:
            continue
        if current is None:
            changes["Connection"].append(
                Change(resource, Action.CREATE, body={**body, "secrets": secrets})
            )
            continue
        wanted = {"description": body.get("description", ""), "config": body.get("config", {})}
        differs = _diff(
            wanted, {"description": current["description"], "config": current["config"]}
        )
        differs += tuple(f"secrets/{k}" for k in sorted(secrets))
        if not differs:
            changes["Connection"].append(Change(resource, Action.UNCHANGED))
            continue
        patch: dict[str, Any] = {k: wanted[k] for k in ("description", "config") if k in differs}
        if secrets:
            patch["secrets"] = secrets
        changes["Connection"].append(Change(resource, Action.UPDATE, differs, patch))


async def _plan_routing(
    target: Target, resources: Sequence[Resource], plan: Plan, changes: dict[str, list[Change]]
) -> None:
    workers = _by_ref(resources, "Worker")
    pools = _by_ref(resources, "Pool")
    rules = _by_ref(resources, "RuleSet")
    if not (workers or pools or rules):
        return
    rule_set = rules[0] if rules else None
    found = await target.validate_routing(
        [r.spec for r in workers],
        [r.spec for r in pools],
        None if rule_set is None else rule_set.spec,
    )
    for problem in found:
        parts = problem.pointer.split("/", 3)
        owner: Resource | None = None
        rest = ""
        if len(parts) >= 3 and parts[1] in ("workers", "pools") and parts[2].isdigit():
            listed = workers if parts[1] == "workers" else pools
            owner = listed[int(parts[2])] if int(parts[2]) < len(listed) else None
            rest = "/" + parts[3] if len(parts) == 4 else ""
        elif len(parts) >= 2 and parts[1] == "rule_set" and rule_set is not None:
            owner = rule_set
            rest = problem.pointer[len("/rule_set") :]
        if owner is None:
            plan.problems.append(Problem("", "", problem.message))
        else:
            plan.problems.append(owner.problem(rest, problem.message))
    if found:
        return
    stored_workers, stored_pools, stored_rules = await target.routing_state()
    by_id = {w["id"]: _builtins(w, Worker) for w in stored_workers}
    for resource in workers:
        changes["Worker"].append(
            _compare(resource, _builtins(resource.spec, Worker), by_id.get(resource.name))
        )
    by_id = {p["id"]: _builtins(p, Pool) for p in stored_pools}
    for resource in pools:
        changes["Pool"].append(
            _compare(resource, _builtins(resource.spec, Pool), by_id.get(resource.name))
        )
    if rule_set is not None:
        stored = None if stored_rules is None else _builtins(stored_rules, RulesBody)
        changes["RuleSet"].append(_compare(rule_set, _builtins(rule_set.spec, RulesBody), stored))


def _compare(resource: Resource, wanted: Any, stored: Any) -> Change:
    if stored is None:
        return Change(resource, Action.CREATE, body=resource.spec)
    differs = _diff(wanted, stored)
    if not differs:
        return Change(resource, Action.UNCHANGED)
    return Change(resource, Action.UPDATE, differs, resource.spec)


def _operation_problems(
    resource: Resource, new_connections: Mapping[str, str], providers: Mapping[str, Any]
) -> list[Problem]:
    """The checks the server makes of ACTION steps naming a connection, for the
    connections this apply creates (the server cannot see them yet)."""
    problems: list[Problem] = []
    steps = resource.spec.get("steps")
    for index, step in enumerate(steps if isinstance(steps, list) else []):
        args = step.get("args") if isinstance(step, dict) else None
        if not isinstance(args, dict) or step.get("type") != "STEP_TYPE_ACTION":
            continue
        name = args.get("connection")
        if not isinstance(name, str) or name not in new_connections:
            continue
        provider = providers.get(new_connections[name])
        if provider is None:
            continue  # the connection's own check reports an unknown provider
        operations = {op["name"]: op for op in provider.get("operations", [])}
        operation = operations.get(args.get("operation"))
        at = f"/steps/{index}/args"
        if operation is None:
            known = ", ".join(sorted(operations)) or "none"
            problems.append(
                resource.problem(
                    at + "/operation",
                    f"provider {provider['name']!r} has no operation"
                    f" {str(args.get('operation'))[:64]!r} (it has: {known})",
                )
            )
            continue
        given = args.get("input", {})
        if not isinstance(given, dict):
            continue
        fields = set(operation.get("input", {}).get("properties", {}))
        for key in given:
            if fields and key not in fields:
                problems.append(resource.problem(f"{at}/input/{escape(key)}", f"no input {key!r}"))
        for key in operation.get("required", []):
            if key not in given:
                problems.append(
                    resource.problem(f"{at}/input/{escape(key)}", f"needs input {key!r}")
                )
    return problems


async def _plan_workflows(
    target: Target,
    resources: list[Resource],
    new_connections: Mapping[str, str],
    plan: Plan,
    changes: dict[str, list[Change]],
) -> None:
    providers = {p["name"]: p for p in await target.providers()} if new_connections else {}
    for resource in resources:
        found = await target.validate_workflow(resource.spec)
        problems = [
            resource.problem(f.pointer, f"{f.code}: {f.message}" if f.code else f.message)
            for f in found
            if not (
                f.code == "definition.unknown_connection"
                and _names_new(resource.spec, f.pointer, new_connections)
            )
        ]
        problems += _operation_problems(resource, new_connections, providers)
        if problems:
            plan.problems.extend(problems)
            continue
        try:
            digest = content_hash(definition_from_obj(resource.spec))
        except DuctorError as exc:
            plan.problems.append(resource.problem("", exc.message))
            continue
        hashes = await target.workflow_hashes(resource.name)
        if not hashes:
            changes["Workflow"].append(Change(resource, Action.CREATE, body=resource.spec))
        elif hashes[-1] == digest:
            changes["Workflow"].append(Change(resource, Action.UNCHANGED))
        elif digest in hashes:
            plan.problems.append(
                resource.problem(
                    "",
                    f"this definition is version {hashes.index(digest) + 1} of"
                    f" {resource.name!r}, but version {len(hashes)} is the latest; a publish"
                    " cannot make an older version the latest again: change the definition"
                    " (e.g. its title) to publish it as a new version",
                )
            )
        else:
            changes["Workflow"].append(
                Change(resource, Action.UPDATE, (f"version {len(hashes) + 1}",), resource.spec)
            )


def _names_new(spec: Any, pointer: str, new_connections: Mapping[str, str]) -> bool:
    """Whether the `connection` field at `pointer` of `spec` names a connection this
    apply creates."""
    value: Any = spec
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            value = value.get(token)
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
        else:
            return False
    return isinstance(value, str) and value in new_connections


async def apply_plan(target: Target, plan: Plan) -> tuple[list[Change], TargetError | None]:
    """Make the plan's creates and updates, in order, stopping at the first the server
    refuses; the changes made, and that refusal (None when all were made)."""
    done: list[Change] = []
    for change in plan.changes:
        if change.action is Action.UNCHANGED:
            continue
        try:
            await _apply(target, change)
        except TargetError as exc:
            return done, exc
        done.append(change)
    return done, None


async def _apply(target: Target, change: Change) -> None:
    kind = change.resource.kind
    if kind == "Connection":
        if change.action is Action.CREATE:
            await target.create_connection(change.body)
        else:
            await target.update_connection(change.resource.name, change.body)
    elif kind == "Worker":
        await target.put_worker(change.body)
    elif kind == "Pool":
        await target.put_pool(change.body)
    elif kind == "RuleSet":
        await target.publish_rules(change.body)
    else:
        await target.publish_workflow(change.body)


__all__ = [
    "ORDER",
    "Action",
    "Change",
    "Found",
    "Plan",
    "Target",
    "TargetError",
    "apply_plan",
    "make_plan",
    "path_pointer",
]
