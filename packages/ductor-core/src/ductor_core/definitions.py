"""The JSON workflow definition: steps, edges, triggers; decoding and the content hash.

The args structs of the step types live in `step_args` and are re-exported
here. This module only models and decodes. `validation` checks a decoded definition
and reports every problem; `tick` runs one. Expressions are CEL source strings.
"""

from __future__ import annotations

import enum
import hashlib
from typing import Any

import msgspec

from ductor_core.builtin_steps import ARGS_BY_TYPE, StepArgs, decode_args
from ductor_core.concurrency import ConcurrencyOption, RateLimit
from ductor_core.errors import DefinitionError
from ductor_core.step_args import (
    ActionArgs,
    BridgeArgs,
    DataflowArgs,
    DefinitionStruct,
    GatherArgs,
    NotifyArgs,
    NotifyCta,
    NotifyEmail,
    RetryPolicy,
    RouteArgs,
    ScatterArgs,
    StepTemplate,
    StepType,
    SubworkflowArgs,
    WaitArgs,
    WaitForEventArgs,
    WaitForSignalArgs,
    WorkflowRef,
)
from ductor_core.step_specs import StepSpecs

__all__ = [
    "ARGS_BY_TYPE",
    "ActionArgs",
    "BridgeArgs",
    "ConcurrencyOption",
    "DataflowArgs",
    "DefinitionStruct",
    "Edge",
    "EdgeType",
    "GatherArgs",
    "NotifyArgs",
    "NotifyCta",
    "NotifyEmail",
    "RateLimit",
    "RetryPolicy",
    "RouteArgs",
    "ScatterArgs",
    "Step",
    "StepArgs",
    "StepTemplate",
    "StepType",
    "SubworkflowArgs",
    "Trigger",
    "WaitArgs",
    "WaitForEventArgs",
    "WaitForSignalArgs",
    "WorkflowDefinition",
    "WorkflowRef",
    "canonical_json",
    "content_hash",
    "decode_args",
    "decode_definition",
    "definition_from_obj",
]


class EdgeType(enum.StrEnum):
    """When an edge is taken: its source succeeded, failed, either, or a condition held."""

    SUCCESS = "EDGE_TYPE_SUCCESS"
    FAILURE = "EDGE_TYPE_FAILURE"
    ALWAYS = "EDGE_TYPE_ALWAYS"
    CONDITION = "EDGE_TYPE_CONDITION"


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the document's structs: frozen, keyword-only, unknown fields rejected."""


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
        """The step's built-in type; raises DefinitionError for any other (a type
        added with a `StepSpec` is only in `type`)."""
        try:
            return StepType(self.type)
        except ValueError:
            raise DefinitionError(
                f"unknown step type {self.type!r}", code="definition.unknown_step_type"
            ) from None

    def typed_args(self, *, specs: StepSpecs | None = None) -> msgspec.Struct:
        """Decode `args` into the struct for this step's type.

        Args:
            specs: the step types to look the type up in; the built-in ones if None.

        Raises:
            DefinitionError: `definition.unknown_step_type` or `definition.bad_args`.
        """
        return decode_args(self.type, self.args, specs=specs)


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
    # The workflow's own limits in the task queue (see `ductor_core.concurrency`).
    concurrency: ConcurrencyOption | None = None


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
    """The canonical encoding: defaults included, keys sorted, no whitespace.

    Fields added after the first release are left out while they hold their
    default, so a definition that does not use them keeps its hash.
    """
    document = msgspec.to_builtins(definition)
    for name in _LATER_FIELDS:
        if document.get(name) is None:
            document.pop(name, None)
    return msgspec.json.encode(document, order="sorted")


_LATER_FIELDS = ("concurrency",)


def content_hash(definition: WorkflowDefinition) -> str:
    """SHA-256 over the canonical encoding, as `sha256:<hex>`; equal content, equal hash."""
    return "sha256:" + hashlib.sha256(canonical_json(definition)).hexdigest()
