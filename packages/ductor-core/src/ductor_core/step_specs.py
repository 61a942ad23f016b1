"""Step types as specs: one value per type says what its args are, how they are
checked beyond their structure, how a run starts the step and which worker handler runs it.

Validation, the tick's index and its dispatch look a step's type up in specs,
so a new worker-run type is one `StepSpec` (an args struct and a handler name)
added to a `StepSpecs` value that is passed to `validate_definition`,
`start_run` and `tick`, plus a handler of that name in the server:

    class EchoArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
        message: str  # CEL

    ECHO = StepSpec(type="STEP_TYPE_ECHO", args=EchoArgs,
                    start=OnWorker(handler="echo"), expressions=("message",))
    specs = BUILTIN_STEP_SPECS.with_specs(ECHO)   # from ductor_core.builtin_steps

Types that run in the coordinator need the tick's own machinery (timers,
waits, child runs, fan-out); their spec names that machinery with
`InCoordinator`, so only the built-in behaviours exist there. Pure data and
pure functions: no I/O, no global registry.
"""

from __future__ import annotations

import builtins
import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import msgspec

from ductor_core.errors import DefinitionError
from ductor_core.step_args import (
    DataflowArgs,
    GatherArgs,
    NotifyArgs,
    ScatterArgs,
    SubworkflowArgs,
    WaitArgs,
    WaitForEventArgs,
    WaitForSignalArgs,
)

__all__ = [
    "STEP_OPTIONS",
    "ArgsCheck",
    "Evaluate",
    "InCoordinator",
    "OnWorker",
    "StepSpec",
    "StepSpecs",
]

A = TypeVar("A", bound=msgspec.Struct)

Evaluate = Callable[[str], Any]
"""Evaluates one CEL source in the step's scope (`input`, `steps`, `run`, and
`item`/`index` for a SCATTER item); raises a DuctorError if evaluation fails."""


class InCoordinator(enum.Enum):
    """A behaviour the tick itself carries out, for the types that run in the coordinator."""

    DATAFLOW = "dataflow"  # evaluated inline; done at once
    GATHER = "gather"  # a SCATTER's results, read inline
    WAIT = "wait"  # a durable timer
    WAIT_FOR_EVENT = "wait_for_event"  # a registered wait, with a timeout timer
    WAIT_FOR_SIGNAL = "wait_for_signal"  # the same, for a signal sent to the run
    SUBWORKFLOW = "subworkflow"  # a child run, awaited
    SCATTER = "scatter"  # one worker task, inline step or child run per item
    NOTIFY = "notify"  # inbox notifications written with the tick; may await a click


# The args each behaviour reads: a spec that names a behaviour must have them.
_BEHAVIOUR_ARGS: dict[InCoordinator, type[msgspec.Struct]] = {
    InCoordinator.DATAFLOW: DataflowArgs,
    InCoordinator.GATHER: GatherArgs,
    InCoordinator.WAIT: WaitArgs,
    InCoordinator.WAIT_FOR_EVENT: WaitForEventArgs,
    InCoordinator.WAIT_FOR_SIGNAL: WaitForSignalArgs,
    InCoordinator.SUBWORKFLOW: SubworkflowArgs,
    InCoordinator.SCATTER: ScatterArgs,
    InCoordinator.NOTIFY: NotifyArgs,
}

# The step options (a step's own `timeout` and `retry`) each behaviour reads; the
# tick ignores the others. A worker-run type reads both.
_BEHAVIOUR_OPTIONS: dict[InCoordinator, frozenset[str]] = {
    InCoordinator.DATAFLOW: frozenset(),  # done at once, never retried
    InCoordinator.GATHER: frozenset(),
    InCoordinator.WAIT: frozenset(),  # its args say how long
    InCoordinator.WAIT_FOR_EVENT: frozenset({"timeout"}),  # when its args have none
    InCoordinator.WAIT_FOR_SIGNAL: frozenset({"timeout"}),
    InCoordinator.SUBWORKFLOW: frozenset({"timeout"}),  # bounds the child; a failed one ends it
    InCoordinator.SCATTER: frozenset(),  # its `step` template's apply per item
    InCoordinator.NOTIFY: frozenset({"timeout"}),  # only while it awaits a click
}

STEP_OPTIONS: tuple[str, ...] = ("retry", "timeout")
"""The fields of a step (and of a SCATTER's template) whose effect depends on its type."""


@dataclass(frozen=True, slots=True)
class OnWorker(Generic[A]):
    """The step is dispatched to a step worker as a task.

    Attributes:
        handler: the name the server registers the handler under. When
            `handler_for` is set, this is the family's prefix (ACTION's
            "action", whose tasks go to "action:<name>").
        handler_for: the task's handler name from the args; None: `handler`.
        payload: the task's payload from the args and an evaluator; None: the
            args as JSON with the spec's `expressions` evaluated in place.
        attempt_timeout: a duration string from the args that bounds each
            attempt when the step sets no `timeout` of its own.
    """

    handler: str
    handler_for: Callable[[A], str] | None = None
    payload: Callable[[A, Evaluate], Any] | None = None
    attempt_timeout: Callable[[A], str | None] | None = None


class ArgsCheck(Protocol):
    """One step's args under validation, as a spec's `check` sees them.

    Structure (required fields, types, unknown fields) is checked before;
    `fields` holds the fields that passed. Pointer parts and names are relative
    to the args object; every report names the step and has code
    `definition.bad_args` unless said otherwise.
    """

    @property
    def fields(self) -> Mapping[str, Any]:
        """The args' fields whose value has the right type, by wire name."""
        ...

    @property
    def raw(self) -> Mapping[str, Any]:
        """The args object as written."""
        ...

    @property
    def ref(self) -> str | None:
        """The step's ref; None inside a SCATTER's template or when the ref is unusable."""
        ...

    @property
    def where(self) -> str:
        """How reports name the step, e.g. "step 'charge'"."""
        ...

    @property
    def prefix(self) -> str:
        """How reports name the args object, e.g. "args." or "step.args."."""
        ...

    @property
    def specs(self) -> StepSpecs:
        """The step types the definition is validated against."""
        ...

    def at(self, *parts: str | int) -> str:
        """The JSON pointer to `parts` under the args object."""
        ...

    def given(self, name: str) -> bool:
        """Whether the args set `name` to something other than null."""
        ...

    def text(self, name: str) -> str | None:
        """Field `name` if it is a string."""
        ...

    def value(self, *parts: str) -> Any:
        """The well-typed value at `parts` (nested objects), or None."""
        ...

    def problem(self, message: str, *parts: str | int) -> None:
        """Report `message` about the value at `parts`."""
        ...

    def expressions(self, *names: str, sees: tuple[str, ...] = ()) -> None:
        """Compile the CEL in each named field (a string, or a map or list of
        strings); code `definition.bad_expression` (or `bad_step_reference`).

        A built-in type's expressions may read only the step's variables
        (`input`, `steps`, `run`, and `item`, `index` in a SCATTER's template)
        and those in `sees` (a WAIT_FOR_EVENT's `match` also sees `event`).
        """
        ...

    def expression(self, source: str, *parts: str | int) -> None:
        """Compile `source`, the CEL found at `parts` (nested objects and list
        indexes), as `expressions` does."""
        ...

    def duration(self, name: str) -> None:
        """Check that field `name`, if a string, is a duration above zero."""
        ...

    def not_blank(self, name: str) -> None:
        """Check that field `name`, if a string, is not blank."""
        ...

    def slug(self, *parts: str) -> None:
        """Check that the string at `parts` is a family slug (`definition.bad_slug`)."""
        ...

    def type_of(self, ref: str) -> str | None:
        """The type written on step `ref` ("" if not a string); None if there is no such step."""
        ...

    def precedes(self, ref: str) -> bool:
        """Whether a path of edges leads from step `ref` to this step."""
        ...

    def template_spec(self, name: str) -> StepSpec[Any] | None:
        """The spec of the step template in field `name`; an unknown type is
        reported (`definition.unknown_step_type`) and gives None."""
        ...

    def template_args(self, name: str, spec: StepSpec[Any]) -> None:
        """Check the template's args in field `name` as `spec`'s args."""
        ...

    def template_limits(self, name: str) -> None:
        """Check the template's `retry` and `timeout` in field `name`."""
        ...


@dataclass(frozen=True, slots=True)
class StepSpec(Generic[A]):
    """Everything the core knows about one step type.

    Attributes:
        type: the wire name, e.g. "STEP_TYPE_NOTIFY".
        args: the args struct (frozen, unknown fields rejected: derive it
            from `DefinitionStruct`).
        start: how a run starts the step: `OnWorker(...)`, or the built-in
            coordinator behaviour it gets.
        expressions: the args fields that hold CEL (a string, or a map or
            list of strings). Validation compiles them (after `check`); for a
            worker-run type the default payload holds their values.
        check: what validation checks beyond structure and `expressions`.
        scatterable: whether a SCATTER may run this type once per item.
    """

    type: str
    args: builtins.type[A]
    start: OnWorker[A] | InCoordinator
    expressions: tuple[str, ...] = ()
    check: Callable[[ArgsCheck], None] | None = None
    scatterable: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.type, str) or not self.type:
            raise ValueError(f"a step type needs a wire name, got {self.type!r}")
        object.__setattr__(self, "type", str(self.type))  # a StepType member becomes plain str
        if not (isinstance(self.args, type) and issubclass(self.args, msgspec.Struct)):
            raise TypeError(f"{self.type}: args must be a msgspec.Struct class")
        config = self.args.__struct_config__
        if not (config.frozen and config.forbid_unknown_fields):
            raise TypeError(
                f"{self.type}: args struct {self.args.__name__} must be frozen and "
                "forbid unknown fields (derive it from DefinitionStruct)"
            )
        fields = self.args.__struct_encode_fields__
        for name in self.expressions:
            if name not in fields:
                raise ValueError(f"{self.type}: expression field {name!r} is not an args field")
        if isinstance(self.start, InCoordinator):
            needed = _BEHAVIOUR_ARGS[self.start]
            if not issubclass(self.args, needed):
                raise TypeError(
                    f"{self.type}: {self.start} runs on {needed.__name__}, not {self.args.__name__}"
                )
        elif not self.start.handler:
            raise ValueError(f"{self.type}: a worker-run type needs a handler name")

    @property
    def options(self) -> frozenset[str]:
        """The `STEP_OPTIONS` a step of this type uses: both for a worker-run type,
        for a coordinator one those its behaviour reads (NOTIFY's `timeout` only
        with `await_action`)."""
        if isinstance(self.start, InCoordinator):
            return _BEHAVIOUR_OPTIONS[self.start]
        return frozenset(STEP_OPTIONS)

    @property
    def worker(self) -> OnWorker[A] | None:
        """How a worker runs it; None if it runs in the coordinator."""
        return self.start if isinstance(self.start, OnWorker) else None

    def decode(self, raw: Any) -> A:
        """The typed args from raw JSON.

        Raises:
            DefinitionError: code `definition.bad_args`, naming the field at fault.
        """
        try:
            return msgspec.convert(raw, self.args)
        except msgspec.ValidationError as exc:
            raise DefinitionError(str(exc), code="definition.bad_args") from exc

    def task(self, args: A, evaluate: Evaluate) -> tuple[str, Any]:
        """The handler name and payload of a worker task for `args`.

        Raises:
            DuctorError: an expression failed to evaluate.
            ValueError: the type does not run on a worker.
        """
        worker = self.worker
        if worker is None:
            raise ValueError(f"{self.type} runs in the coordinator, not on a worker")
        handler = worker.handler if worker.handler_for is None else worker.handler_for(args)
        if worker.payload is not None:
            return handler, worker.payload(args, evaluate)
        payload = msgspec.to_builtins(args)
        for name in self.expressions:
            payload[name] = _evaluated(payload[name], evaluate)
        return handler, payload

    def attempt_timeout(self, args: A) -> str | None:
        """The args' own bound on one attempt, if the type has one."""
        worker = self.worker
        if worker is None or worker.attempt_timeout is None:
            return None
        return worker.attempt_timeout(args)


def _evaluated(value: Any, evaluate: Evaluate) -> Any:
    if isinstance(value, str):
        return evaluate(value)
    if isinstance(value, dict):
        return {key: evaluate(source) for key, source in value.items()}
    if isinstance(value, list):
        return [evaluate(source) for source in value]
    return value  # an optional expression left out


class StepSpecs:
    """An immutable set of step specs, one per wire name, in a fixed order.

    Pass one to `validate_definition`, `start_run` and `tick`; all three
    default to the built-in set (`ductor_core.builtin_steps.BUILTIN_STEP_SPECS`).
    """

    __slots__ = ("_by_type", "_scatterable")

    def __init__(self, specs: Iterable[StepSpec[Any]] = ()) -> None:
        by_type: dict[str, StepSpec[Any]] = {}
        for spec in specs:
            if spec.type in by_type:
                raise ValueError(f"step type {spec.type} is specified twice")
            by_type[spec.type] = spec
        self._by_type = by_type
        self._scatterable = tuple(sorted(s.type for s in by_type.values() if s.scatterable))

    def with_specs(self, *specs: StepSpec[Any]) -> StepSpecs:
        """A new set with `specs` added (a type already here is an error)."""
        return StepSpecs([*self._by_type.values(), *specs])

    def get(self, step_type: str) -> StepSpec[Any] | None:
        """The spec of `step_type`, or None if it is not in the set."""
        return self._by_type.get(step_type)

    def require(self, step_type: str) -> StepSpec[Any]:
        """The spec of `step_type`.

        Raises:
            DefinitionError: code `definition.unknown_step_type`.
        """
        spec = self._by_type.get(step_type)
        if spec is None:
            raise DefinitionError(
                f"unknown step type {step_type!r}", code="definition.unknown_step_type"
            )
        return spec

    def names(self) -> tuple[str, ...]:
        """Every wire name, in the order the specs were given."""
        return tuple(self._by_type)

    @property
    def scatterable(self) -> tuple[str, ...]:
        """The wire names a SCATTER may run per item, sorted."""
        return self._scatterable

    def worker_handlers(self) -> dict[str, str]:
        """The handler name each worker-run type needs registered, by wire name."""
        return {
            spec.type: spec.start.handler
            for spec in self._by_type.values()
            if isinstance(spec.start, OnWorker)
        }

    def __contains__(self, step_type: object) -> bool:
        return step_type in self._by_type

    def __iter__(self) -> Iterator[StepSpec[Any]]:
        return iter(self._by_type.values())

    def __len__(self) -> int:
        return len(self._by_type)

    def __repr__(self) -> str:
        return f"StepSpecs({', '.join(self._by_type)})"
