"""The JSON workflow definition: steps, edges, triggers, and typed args per step type.

This module only models and decodes. `validation` checks a decoded definition
and reports every problem; `tick` runs one. Expressions are CEL source strings.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any, Literal

import msgspec

from ductor_core.errors import DefinitionError


class StepType(enum.StrEnum):
    """What a step does; wire names in protobuf enum style."""

    DATAFLOW = "STEP_TYPE_DATAFLOW"
    WAIT = "STEP_TYPE_WAIT"
    WAIT_FOR_EVENT = "STEP_TYPE_WAIT_FOR_EVENT"
    WAIT_FOR_SIGNAL = "STEP_TYPE_WAIT_FOR_SIGNAL"
    ACTION = "STEP_TYPE_ACTION"
    SCATTER = "STEP_TYPE_SCATTER"
    GATHER = "STEP_TYPE_GATHER"
    SUBWORKFLOW = "STEP_TYPE_SUBWORKFLOW"
    BRIDGE = "STEP_TYPE_BRIDGE"
    ROUTE = "STEP_TYPE_ROUTE"
    NOTIFY = "STEP_TYPE_NOTIFY"


class EdgeType(enum.StrEnum):
    """When an edge is taken: its source succeeded, failed, either, or a condition held."""

    SUCCESS = "EDGE_TYPE_SUCCESS"
    FAILURE = "EDGE_TYPE_FAILURE"
    ALWAYS = "EDGE_TYPE_ALWAYS"
    CONDITION = "EDGE_TYPE_CONDITION"


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of definition structs: frozen, keyword-only, unknown fields rejected."""


class RetryPolicy(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-step retry: attempts in all (1 = no retry), exponential backoff with a cap."""

    max_attempts: int = 3
    initial_interval: str = "1s"
    backoff_coefficient: float = 2.0
    max_interval: str = "5m"
    non_retryable_codes: list[str] = []


class Step(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One node of the DAG. `type` and `args` stay loose here so that validation
    can report an unknown type or bad args with a pointer instead of failing to
    decode; `typed_args()` gives the checked struct."""

    ref: str
    type: str
    title: str = ""
    args: dict[str, Any] = {}
    retry: RetryPolicy | None = None
    timeout: str | None = None

    @property
    def step_type(self) -> StepType:
        """The step's type; raises DefinitionError if it is not one we know."""
        try:
            return StepType(self.type)
        except ValueError:
            raise DefinitionError(
                f"unknown step type {self.type!r}", code="definition.unknown_step_type"
            ) from None

    def typed_args(self) -> StepArgs:
        """Decode `args` into the struct for this step's type."""
        return decode_args(self.step_type, self.args)


class Edge(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A directed edge; `condition` (CEL) only for EDGE_TYPE_CONDITION."""

    source_ref: str
    target_ref: str
    type: str = EdgeType.SUCCESS.value
    condition: str | None = None

    @property
    def edge_type(self) -> EdgeType:
        """The edge's type; raises DefinitionError if it is not one we know."""
        try:
            return EdgeType(self.type)
        except ValueError:
            raise DefinitionError(
                f"unknown edge type {self.type!r}", code="definition.unknown_edge_type"
            ) from None


class Trigger(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a run when an event named `event` arrives and `filter` (CEL over `event`) holds."""

    event: str
    filter: str | None = None


class WorkflowDefinition(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A workflow as published: plain JSON, as in the seed's hello-world."""

    family_slug: str
    title: str = ""
    description: str = ""
    steps: list[Step] = []
    edges: list[Edge] = []
    triggers: list[Trigger] = []
    input_schema: dict[str, Any] | None = None
    # CEL over `input`, `steps` and `run`. A string is one expression; a map
    # projects each key. None: the outputs of the steps that end the graph.
    output: str | dict[str, str] | None = None


# --- typed args, one struct per step type ------------------------------------


class DataflowArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Deterministic transform evaluated in the coordinator.

    - project: `project` maps output keys to expressions;
    - filter: keep the elements of `items` for which `predicate` (over `item`) holds;
    - map: `expression` (over `item`, `index`) applied to each element of `items`;
    - merge: the maps that `sources` evaluate to, merged left to right;
    - pick: the `keys` of the map that `source` evaluates to.
    """

    operation: Literal["project", "filter", "map", "merge", "pick"]
    project: dict[str, str] | None = None
    items: str | None = None
    predicate: str | None = None
    expression: str | None = None
    sources: list[str] | None = None
    source: str | None = None
    keys: list[str] | None = None


class WaitArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A durable delay: exactly one of `duration` ("2s") or `until` (CEL timestamp)."""

    duration: str | None = None
    until: str | None = None


class WaitForEventArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Wait for an event named `event` whose `match` (CEL over `event`, `input`, `steps`) holds."""

    event: str
    match: str | None = None
    timeout: str | None = None


class WaitForSignalArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Wait for the signal `signal` sent to this run."""

    signal: str
    timeout: str | None = None


class ActionArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Dispatch a provider action to a worker. `params` values are CEL, evaluated
    by the coordinator, so workers receive plain values."""

    action: str
    params: dict[str, str] = {}
    connection: str | None = None


class StepTemplate(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The step a SCATTER runs once per item (its expressions also see `item`, `index`)."""

    type: str
    args: dict[str, Any] = {}
    retry: RetryPolicy | None = None
    timeout: str | None = None


class WorkflowRef(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A published workflow family, at `version` or the latest."""

    family_slug: str
    version: int | None = None


class ScatterArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fan out `step` or `workflow` once per element of `items`, at most
    `max_concurrency` at a time. Output: the per-item results in item order."""

    items: str
    step: StepTemplate | None = None
    workflow: WorkflowRef | None = None
    input: str | None = None
    max_concurrency: int = 10
    tolerate_failures: bool = False


class GatherArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Collect a SCATTER's results in item order: `{items, succeeded, failed}`."""

    scatter: str


class SubworkflowArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a child run of `family_slug` (at `version`, else latest) with `input` (CEL)."""

    family_slug: str
    version: int | None = None
    input: str | None = None


class BridgeArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Drive a workflow hosted by an SDK app through the bridge protocol."""

    app_id: str
    workflow: str
    input: str | None = None


class RouteArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Route a routable built from CEL; optionally wait for the assignee to complete it."""

    kind: str
    attributes: dict[str, str] = {}
    pool: str | None = None
    price: str | None = None
    await_completion: bool = False
    timeout: str | None = None


class NotifyArgs(_Wire, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Create an inbox notification; every field is CEL."""

    recipient: str
    title: str
    body: str = '""'
    channel: str | None = None


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

ARGS_BY_TYPE: dict[StepType, type[StepArgs]] = {
    StepType.DATAFLOW: DataflowArgs,
    StepType.WAIT: WaitArgs,
    StepType.WAIT_FOR_EVENT: WaitForEventArgs,
    StepType.WAIT_FOR_SIGNAL: WaitForSignalArgs,
    StepType.ACTION: ActionArgs,
    StepType.SCATTER: ScatterArgs,
    StepType.GATHER: GatherArgs,
    StepType.SUBWORKFLOW: SubworkflowArgs,
    StepType.BRIDGE: BridgeArgs,
    StepType.ROUTE: RouteArgs,
    StepType.NOTIFY: NotifyArgs,
}


def decode_args(step_type: StepType, args: dict[str, Any]) -> StepArgs:
    """Convert a step's raw `args` into the typed struct for `step_type`.

    Raises:
        DefinitionError: code `definition.bad_args`, naming the field at fault.
    """
    try:
        return msgspec.convert(args, ARGS_BY_TYPE[step_type])
    except msgspec.ValidationError as exc:
        raise DefinitionError(str(exc), code="definition.bad_args") from exc


_decoder = msgspec.json.Decoder(WorkflowDefinition)


def decode_definition(data: bytes | str) -> WorkflowDefinition:
    """Decode a definition from JSON, rejecting unknown fields and wrong types.

    Raises:
        DefinitionError: code `definition.malformed`; the message names the path.
    """
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise DefinitionError(str(exc), code="definition.malformed") from exc


def definition_from_obj(obj: Any) -> WorkflowDefinition:
    """Convert an already-parsed JSON object into a definition (same errors)."""
    try:
        return msgspec.convert(obj, WorkflowDefinition)
    except msgspec.ValidationError as exc:
        raise DefinitionError(str(exc), code="definition.malformed") from exc


def canonical_json(definition: WorkflowDefinition) -> bytes:
    """The canonical encoding: defaults included, keys sorted, no whitespace."""
    return msgspec.json.encode(msgspec.to_builtins(definition), order="sorted")


def content_hash(definition: WorkflowDefinition) -> str:
    """SHA-256 over the canonical encoding, as `sha256:<hex>`; equal content, equal hash."""
    return "sha256:" + hashlib.sha256(canonical_json(definition)).hexdigest()
