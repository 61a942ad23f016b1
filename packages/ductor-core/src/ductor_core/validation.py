"""Definition validation: every problem of a workflow definition at once, each with a
stable code, a readable message and an RFC 6901 JSON pointer. No I/O; never raises on bad input.

msgspec stops decoding at the first error, so the raw JSON is walked here by
hand (guided by the definition structs' own type information), and the semantic
checks run on whatever parts are well formed.

Problems come in the order the document is walked: unknown top-level fields,
then `family_slug`, `title`, `description`, each step, each edge, each
trigger, `input_schema`, `output`, `concurrency`, and last the graph-wide problems (cycles,
unreachable steps). Within one object, structural problems (missing, unknown
or wrongly typed fields, in the object's own key order) come before semantic ones.

What "unreachable" means here. A step with no incoming edge is a root, where a
run starts. A step is unreachable when no root reaches it by following edges,
whatever their type. In an acyclic graph every step is reachable, so this can
only happen through a cycle that nothing outside it leads into (`x -> y -> x`),
and to the steps after such a cycle: these would wait forever for an edge that
is never decided. A cycle that *is* entered from a root (`a -> b -> c -> b`) is
reported as a cycle only; its steps are reachable, though the join rule means
they would deadlock too, which is exactly why every cycle is an error.

What a step's args must hold comes from its type's spec (`step_specs`): the
args struct gives the structure, the spec's `expressions` the CEL to compile
and its `check` the rest, reported through `ArgsCheck`. A `check` that raises
is reported as `definition.bad_args` on the args, never raised.

What an expression may read. Each place gives its expressions some variables
(step args `input`, `steps`, `run`; a SCATTER's template and a DATAFLOW's
per-element expressions also `item`, `index`; a WAIT_FOR_EVENT's `match` also
`event`; an edge condition also `output`; a trigger filter only `event`;
`concurrency.key` only `input`): reading any other top-level name
(`free_variables`) is a `definition.bad_expression`. The args of a step type
that is not built in are not judged so: its handler may evaluate them itself.

A step's expressions (its args, and a SCATTER's per-item template) may read
`steps.<ref>` only for steps that come before it
(a path of edges leads from them to it): any other step may not have finished
yet, or may finish only in some runs. An edge condition may read its source
and the steps before that; `output` may read any step. References are found
in the source text (`steps.x`, `steps['x']`, skipping string literals and
comments); a reference built at run time (`steps[name]`) is not judged. On a
cyclic graph "before" has no meaning, so references are not judged there.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Collection
from datetime import timedelta
from typing import Any

import msgspec
import msgspec.inspect as mi

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS, uncarried_name
from ductor_core.concurrency import ConcurrencyOption
from ductor_core.definitions import (
    Edge,
    EdgeType,
    RetryPolicy,
    Step,
    StepTemplate,
    StepType,
    Trigger,
    WorkflowDefinition,
)
from ductor_core.durations import parse_duration
from ductor_core.errors import DefinitionError, DurationError, ExpressionError
from ductor_core.expressions import ExpressionEngine, default_engine, free_variables
from ductor_core.graph import Graph
from ductor_core.input_schemas import schema_problems
from ductor_core.step_specs import STEP_OPTIONS, InCoordinator, StepSpec, StepSpecs

SLUG_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""What a `family_slug` must fully match."""

REF_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
"""What a step `ref` must fully match."""

SCATTER_STEP_TYPES: frozenset[StepType] = frozenset(
    StepType(name) for name in BUILTIN_STEP_SPECS.scatterable
)
"""The built-in step types a SCATTER may run once per item (their specs say so)."""

PROBLEM_CODES: dict[str, str] = {
    "definition.malformed": "not an object, a missing required field, or a value of the wrong type",
    "definition.unknown_field": "a field the definition format does not have",
    "definition.bad_slug": "a family slug that is not lowercase letters, digits and '-'",
    "definition.empty": "a definition with no steps",
    "definition.bad_ref": "a step ref that is not a letter or '_', then letters, digits, '_', '-'",
    "definition.duplicate_ref": "two steps with the same ref",
    "definition.unknown_step_type": "a step type that does not exist",
    "definition.unknown_edge_type": "an edge type that does not exist",
    "definition.bad_args": "step args that are missing, unknown, wrongly typed or inconsistent",
    "definition.bad_duration": "a duration string that does not parse, or a zero timeout",
    "definition.bad_retry": "a retry policy that cannot work",
    "definition.bad_step_option": "a step's timeout or retry on a step type that does not use it",
    "definition.bad_expression": (
        "a CEL expression that does not compile, or reads a variable its place does not give"
    ),
    "definition.expression_too_costly": "a CEL expression over the engine's cost limits",
    "definition.bad_step_reference": "an expression reading a missing step or one not before it",
    "definition.dangling_edge": "an edge whose source or target is not a step",
    "definition.self_loop": "an edge from a step to itself",
    "definition.duplicate_edge": "the same edge twice",
    "definition.cycle": "steps that form a cycle",
    "definition.unreachable_step": "a step no starting step leads to",
    "definition.condition_missing": "a CONDITION edge without a condition",
    "definition.condition_unexpected": "a condition on an edge that is not a CONDITION edge",
    "definition.bad_trigger": "a trigger without an event name",
    "definition.bad_output": "an output that is not a CEL string or an object of them",
    "definition.bad_input_schema": (
        "an input schema that is not a JSON Schema, or that reaches outside itself,"
        " uses a pattern RE2 cannot run or is too large"
    ),
    "definition.bad_concurrency": "a concurrency option with no limit, or a limit that cannot work",
}
"""Every problem code validation reports, with what it means."""


_MALFORMED = "definition.malformed"
_UNKNOWN_FIELD = "definition.unknown_field"
_BAD_ARGS = "definition.bad_args"
_BAD_EXPRESSION = "definition.bad_expression"
_TOO_COSTLY = "definition.expression_too_costly"
_BAD_DURATION = "definition.bad_duration"
_BAD_RETRY = "definition.bad_retry"
_BAD_STEP_OPTION = "definition.bad_step_option"
_BAD_SLUG = "definition.bad_slug"
_BAD_CONCURRENCY = "definition.bad_concurrency"

_JSON_SCHEMA_TYPES = frozenset(
    {"object", "array", "string", "number", "integer", "boolean", "null"}
)

# `steps.<ref>` and `steps['<ref>']` in CEL source. String literals and comments
# are matched too, so that finditer skips over them whole; `x.steps` is a field
# of something else, not the `steps` variable.
_STEP_READS = re.compile(
    r"(?P<skip>//[^\n]*"  # a comment
    r"|[rRbB]{0,2}(?:'\'\'.*?'\'\'|\"\"\".*?\"\"\""  # a triple-quoted string
    r"|(?:[rR][bB]?|[bB][rR])(?:'[^'\n]*'|\"[^\"\n]*\")"  # a raw string: no escapes
    r"|[bB]?(?:'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\")))"  # a quoted string
    r"|(?<![\w.])steps\s*(?:\.\s*(?P<field>[A-Za-z_][A-Za-z0-9_]*)"
    r"|\[\s*(?:'(?P<single>[^'\\]*)'|\"(?P<double>[^\"\\]*)\")\s*\])",
    re.DOTALL,
)

_PLAIN_STEP_READS = re.compile(r"(?<![\w.])steps\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)")

# The variables each place's expressions are evaluated with (the tick's
# `activation`, `concurrency.key_value`, the engine's trigger match).
_STEP_VARIABLES = ("input", "steps", "run")
_ITEM_VARIABLES = ("item", "index")
_CONDITION_VARIABLES = (*_STEP_VARIABLES, "output")
_TRIGGER_VARIABLES = ("event",)
_KEY_VARIABLES = ("input",)


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One thing wrong with a definition.

    Attributes:
        code: stable machine code, e.g. `definition.cycle`.
        message: what is wrong, for a person.
        pointer: RFC 6901 JSON pointer to the offending place ("" is the whole document).
    """

    code: str
    message: str
    pointer: str


class ValidationReport(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of validating one definition: valid, or every problem found."""

    valid: bool
    problems: list[Problem]

    def raise_for_problems(self) -> None:
        """Raise if the definition is invalid.

        Raises:
            DefinitionError: code `definition.invalid`; `details` holds the problems.
        """
        if self.valid:
            return
        first = self.problems[0]
        more = len(self.problems) - 1
        suffix = f" (and {more} more problem{'s' if more != 1 else ''})" if more else ""
        raise DefinitionError(
            f"invalid definition: {first.message}{suffix}",
            code="definition.invalid",
            details=[msgspec.to_builtins(p) for p in self.problems],
        )


def validate_definition(
    obj: Any, *, engine: ExpressionEngine | None = None, specs: StepSpecs | None = None
) -> ValidationReport:
    """Check a definition and report every problem at once.

    Args:
        obj: parsed JSON (any value `json.loads` can return) or a decoded
            `WorkflowDefinition`.
        engine: compiles the CEL expressions; `default_engine()` if None. Its
            cache makes validating the same expressions again cheap.
        specs: the step types a step may have; the built-in ones if None.

    Returns:
        The report; `valid` is true exactly when `problems` is empty.
    """
    if isinstance(obj, WorkflowDefinition):
        obj = msgspec.to_builtins(obj)
    walker = _Walker(
        engine if engine is not None else default_engine(),
        BUILTIN_STEP_SPECS if specs is None else specs,
    )
    walker.definition(obj)
    return ValidationReport(valid=not walker.problems, problems=walker.problems)


def validate_definition_json(
    data: bytes | str, *, engine: ExpressionEngine | None = None, specs: StepSpecs | None = None
) -> ValidationReport:
    """Parse JSON text and validate it; text that is not JSON is one `definition.malformed`."""
    try:
        obj = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        problem = Problem(code=_MALFORMED, message=f"not valid JSON: {exc}", pointer="")
        return ValidationReport(valid=False, problems=[problem])
    return validate_definition(obj, engine=engine, specs=specs)


# --- pointers and wording ---------------------------------------------------------


def _ptr(base: str, *parts: str | int) -> str:
    for part in parts:
        text = str(part)
        if "~" in text or "/" in text:
            text = text.replace("~", "~0").replace("/", "~1")
        base += "/" + text
    return base


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _expected(t: mi.Type) -> str:
    if isinstance(t, mi.StrType):
        return "a string"
    if isinstance(t, mi.IntType):
        return "an integer"
    if isinstance(t, mi.FloatType):
        return "a number"
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.ListType):
        return f"an array of {_plural(t.item_type)}"
    if isinstance(t, mi.DictType):
        if isinstance(t.value_type, mi.AnyType):
            return "an object"
        return f"an object of {_plural(t.value_type)}"
    if isinstance(t, mi.StructType):
        return "an object"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(repr(v) for v in t.values)
    if isinstance(t, mi.UnionType):
        return " or ".join(_expected(member) for member in t.types)
    return "any value"


def _plural(t: mi.Type) -> str:
    if isinstance(t, mi.StrType):
        return "strings"
    if isinstance(t, mi.IntType):
        return "integers"
    return "values"


def _struct_info(cls: type[msgspec.Struct]) -> mi.StructType:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return info


_STEP = _struct_info(Step)
_EDGE = _struct_info(Edge)
_TRIGGER = _struct_info(Trigger)
_RETRY = _struct_info(RetryPolicy)
_CONCURRENCY = _struct_info(ConcurrencyOption)
_TEMPLATE = _struct_info(StepTemplate)
_RETRY_DEFAULTS = RetryPolicy()
_EDGE_TYPES = {t.value: t for t in EdgeType}
# Type information of each args struct, filled on first use.
_ARGS: dict[type, mi.StructType] = {}
# Field lookup per struct, filled on first use (structs are few and fixed).
_FIELDS: dict[type, tuple[dict[str, mi.Field], tuple[str, ...]]] = {}
_UNSEEN = "\0unseen"  # not a compile error any engine can return
_TOP_FIELDS = frozenset(f.encode_name for f in _struct_info(WorkflowDefinition).fields)


# --- the walk ---------------------------------------------------------------------


class _Walker:
    """Collects problems while walking one raw definition."""

    def __init__(self, engine: ExpressionEngine, specs: StepSpecs) -> None:
        self.engine = engine
        self.specs = specs
        self.problems: list[Problem] = []
        self._compiled: dict[str, str | None] = {}
        self._durations: dict[str, timedelta] = {}
        self.first_index: dict[str, int] = {}
        self.types: dict[str, str] = {}
        self.graph = Graph((), ())
        self.edge_index: list[int] = []
        self.steps_known = True
        self.acyclic = True
        self.cycles: list[list[int]] = []
        # Whose view of `steps` the expressions being checked have: a step ref
        # (its ancestors), an edge's source (it and its ancestors), "*" (every
        # step, for `output`) or None (not checked).
        self.reader: str | None = None
        self.reader_sees_itself = False
        self._reads: dict[str, list[str]] = {}
        # The variables the expressions being checked are evaluated with; None:
        # not judged (a step type the server adds may evaluate its CEL itself).
        self.variables: tuple[str, ...] | None = None
        self._functions: frozenset[str] | None = None

    def add(self, code: str, pointer: str, message: str) -> None:
        self.problems.append(Problem(code=code, message=message, pointer=pointer))

    # structural checks, driven by the structs' own type information

    def check(
        self, value: Any, t: mi.Type, pointer: str, where: str, label: str, code: str
    ) -> tuple[bool, Any]:
        """Check `value` against `t`; report what is wrong with `code`.

        Returns whether it conforms and, for a struct, the dict of its
        conforming fields (for anything else, the value itself).
        """
        if isinstance(t, mi.UnionType):
            members = [m for m in t.types if not isinstance(m, mi.NoneType)]
            if value is None and len(members) < len(t.types):
                return True, None
            if len(members) == 1:
                return self.check(value, members[0], pointer, where, label, code)
            if any(_conforms(value, m) for m in members):
                return True, value
            self._wrong(value, t, pointer, where, label, code)
            return False, None
        if isinstance(t, mi.StructType):
            if not isinstance(value, dict):
                self._wrong(value, t, pointer, where, label, code)
                return False, None
            unknown = _UNKNOWN_FIELD if code == _MALFORMED else code
            return True, self.struct(value, t, pointer, where, label + ".", code, unknown)
        if isinstance(t, mi.ListType):
            if not isinstance(value, list):
                self._wrong(value, t, pointer, where, label, code)
                return False, None
            ok = True
            for i, item in enumerate(value):
                good, _ = self.check(
                    item, t.item_type, _ptr(pointer, i), where, f"{label}[{i}]", code
                )
                ok = ok and good
            return ok, value
        if isinstance(t, mi.DictType):
            if not isinstance(value, dict):
                self._wrong(value, t, pointer, where, label, code)
                return False, None
            ok = True
            for key, item in value.items():
                if not isinstance(key, str):
                    self.add(code, pointer, f"{where}: '{label}' has a key that is not a string")
                    ok = False
                    continue
                good, _ = self.check(
                    item, t.value_type, _ptr(pointer, key), where, f"{label}.{key}", code
                )
                ok = ok and good
            return ok, value
        if _conforms(value, t):
            return True, value
        self._wrong(value, t, pointer, where, label, code)
        return False, None

    def struct(
        self,
        raw: dict[Any, Any],
        info: mi.StructType,
        pointer: str,
        where: str,
        prefix: str,
        code: str,
        unknown_code: str,
    ) -> dict[str, Any]:
        """Check an object's fields; return those that conform."""
        known = _FIELDS.get(info.cls)
        if known is None:
            known = _FIELDS[info.cls] = (
                {f.encode_name: f for f in info.fields},
                tuple(f.encode_name for f in info.fields if f.required),
            )
        fields, required = known
        for name in required:
            if name not in raw:
                self.add(
                    code,
                    _ptr(pointer, name),
                    f"{where}: missing required field '{prefix}{name}'",
                )
        ok: dict[str, Any] = {}
        for key, value in raw.items():
            field = fields.get(key) if isinstance(key, str) else None
            if field is None:
                hint = ""
                if isinstance(key, str):
                    close = difflib.get_close_matches(key, list(fields), n=1)
                    hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
                self.add(
                    unknown_code,
                    _ptr(pointer, str(key)),
                    f"{where}: unknown field '{prefix}{key}'{hint}",
                )
                continue
            if _conforms(value, field.type):
                ok[key] = value  # the common case: no pointer or label to build
                continue
            good, cleaned = self.check(
                value, field.type, _ptr(pointer, key), where, prefix + key, code
            )
            if good:
                ok[key] = cleaned
        return ok

    def _wrong(
        self, value: Any, t: mi.Type, pointer: str, where: str, label: str, code: str
    ) -> None:
        self.add(code, pointer, f"{where}: '{label}' must be {_expected(t)}, got {_kind(value)}")

    # leaf checks

    def cel(self, source: str, base: str, *parts: str | int, where: str, label: str) -> None:
        """Compile one CEL expression at `base`/`parts`; report it if it does not compile.

        The pointer is only built for a problem: most expressions are fine.
        """
        error = self._compiled.get(source, _UNSEEN)
        if error is _UNSEEN:
            error = self._compiled[source] = _compile_error(self.engine, source)
        if error is not None:
            self.add(
                # `expression.too_costly` messages start so (expressions/_cost.py)
                _TOO_COSTLY if error.startswith("too costly: ") else _BAD_EXPRESSION,
                _ptr(base, *parts),
                f"{_lead(where)}'{label}' is not valid CEL ({error}): {_show(source)}",
            )
            return
        if self.variables is not None:
            self.unknown_variables(source, self.variables, base, parts, where, label)
        if self.reader is not None and "steps" in source:
            self.step_reads(source, base, parts, where, label)

    def unknown_variables(
        self,
        source: str,
        variables: tuple[str, ...],
        base: str,
        parts: tuple[str | int, ...],
        where: str,
        label: str,
    ) -> None:
        """Report the variables an expression reads that its place does not give it."""
        if self._functions is None:
            self._functions = self.engine.functions.names()
        names = free_variables(source, self._functions) or ()
        unknown = [name for name in names if name not in variables]
        if unknown:
            self.add(
                _BAD_EXPRESSION,
                _ptr(base, *parts),
                f"{_lead(where)}'{label}' {_unseen(unknown, variables)}: {_show(source)}",
            )

    def _may_read(self, ref: str, reader: str) -> bool:
        if reader == "*" or self.graph.precedes(ref, reader):
            return True
        return ref == reader and self.reader_sees_itself

    def step_reads(
        self, source: str, base: str, parts: tuple[str | int, ...], where: str, label: str
    ) -> None:
        """Report each `steps.<ref>` an expression reads that cannot be there for it."""
        reads = self._reads.get(source)
        if reads is None:
            reads = self._reads[source] = _step_reads(source)
        reader = self.reader
        for ref in reads:
            if ref not in self.first_index:
                problem = f"there is no step '{ref}'"
            elif self._may_read(ref, reader or ""):
                continue
            elif ref == reader:
                problem = "a step cannot read its own output"
            elif self.reader_sees_itself:
                problem = (
                    f"step '{ref}' does not come before this edge's source '{reader}', "
                    "so its output may not exist yet"
                )
            else:
                problem = (
                    f"step '{ref}' does not come before '{reader}' (no path of edges leads "
                    "from it here), so its output may not exist yet"
                )
            self.add(
                "definition.bad_step_reference",
                _ptr(base, *parts),
                f"{_lead(where)}'{label}' reads steps.{ref}, but {problem}",
            )

    def duration(self, text: str, pointer: str, where: str, label: str) -> bool:
        """Parse a duration; report it and return False if it does not parse or is zero."""
        try:
            value = self._durations.get(text)
            if value is None:
                value = self._durations[text] = parse_duration(text)
        except DurationError:
            self.add(
                _BAD_DURATION,
                pointer,
                f"{where}: '{label}' is not a duration: {text!r} "
                "(use numbers with units ms, s, m, h, d, e.g. '1h30m')",
            )
            return False
        if not value:
            self.add(_BAD_DURATION, pointer, f"{where}: '{label}' must be longer than zero")
            return False
        return True

    def not_blank(
        self, ok: dict[str, Any], name: str, pointer: str, where: str, label: str
    ) -> None:
        value = ok.get(name)
        if isinstance(value, str) and not value.strip():
            self.add(_BAD_ARGS, _ptr(pointer, name), f"{where}: '{label}{name}' must not be empty")

    def slug(self, value: str, pointer: str, where: str, label: str) -> None:
        if not SLUG_PATTERN.fullmatch(value):
            self.add(
                _BAD_SLUG,
                pointer,
                f"{_lead(where)}'{label}' must be lowercase letters, digits and '-', "
                f"starting with a letter or digit, at most 63 long; got {_show(value)}",
            )

    # the document

    def definition(self, obj: Any) -> None:
        where = ""
        if not isinstance(obj, dict):
            self.add(_MALFORMED, "", f"a definition must be a JSON object, got {_kind(obj)}")
            return
        for key in obj:
            if key not in _TOP_FIELDS:
                close = difflib.get_close_matches(str(key), sorted(_TOP_FIELDS), n=1)
                hint = f" (did you mean '{close[0]}'?)" if close else ""
                self.add(_UNKNOWN_FIELD, _ptr("", str(key)), f"unknown field '{key}'{hint}")

        if "family_slug" not in obj:
            self.add(_MALFORMED, "/family_slug", "missing required field 'family_slug'")
        else:
            slug = obj["family_slug"]
            if isinstance(slug, str):
                self.slug(slug, "/family_slug", where, "family_slug")
            else:
                self.add(
                    _MALFORMED, "/family_slug", f"'family_slug' must be a string, got {_kind(slug)}"
                )
        for name in ("title", "description"):
            if name in obj and not isinstance(obj[name], str):
                self.add(
                    _MALFORMED, f"/{name}", f"'{name}' must be a string, got {_kind(obj[name])}"
                )

        steps = self._list(obj, "steps")
        edges = self._list(obj, "edges")
        triggers = self._list(obj, "triggers")
        self.steps_known = steps is not None
        self._index(steps or [], edges or [])

        if steps is not None:
            if not steps:
                self.add("definition.empty", "/steps", "a definition needs at least one step")
            for i, raw in enumerate(steps):
                self.step(i, raw)
        seen_edges: dict[tuple[str, str, str, str | None], int] = {}
        for i, raw in enumerate(edges or []):
            self.edge(i, raw, seen_edges)
        for i, raw in enumerate(triggers or []):
            self.trigger(i, raw)
        if "input_schema" in obj:
            self.input_schema(obj["input_schema"])
        if "output" in obj:
            self.output(obj["output"])
        if "concurrency" in obj:
            self.concurrency(obj["concurrency"])
        self.graph_problems()

    def _list(self, obj: dict[Any, Any], name: str) -> list[Any] | None:
        value = obj.get(name, [])
        if isinstance(value, list):
            return value
        self.add(_MALFORMED, f"/{name}", f"'{name}' must be an array, got {_kind(value)}")
        return None

    def _index(self, steps: list[Any], edges: list[Any]) -> None:
        """First pass: where each ref is first defined, its type, and the graph."""
        for i, raw in enumerate(steps):
            if isinstance(raw, dict) and isinstance(raw.get("ref"), str):
                ref = raw["ref"]
                if ref not in self.first_index:
                    self.first_index[ref] = i
                    kind = raw.get("type")
                    self.types[ref] = kind if isinstance(kind, str) else ""
        graph_edges: list[Edge] = []
        for i, raw in enumerate(edges):
            if not isinstance(raw, dict):
                continue
            source, target = raw.get("source_ref"), raw.get("target_ref")
            if isinstance(source, str) and isinstance(target, str):
                graph_edges.append(Edge(source_ref=source, target_ref=target))
                self.edge_index.append(i)
        self.graph = Graph(self.first_index, graph_edges)
        # With a cycle, "comes before" has no meaning: the cycle is the problem.
        self.cycles = self.graph.cycles()
        self.acyclic = self.steps_known and not self.cycles

    def step(self, i: int, raw: Any) -> None:
        pointer = _ptr("/steps", i)
        ref = raw.get("ref") if isinstance(raw, dict) else None
        where = f"step '{ref}'" if isinstance(ref, str) else f"steps[{i}]"
        if not isinstance(raw, dict):
            self.add(_MALFORMED, pointer, f"{where} must be an object, got {_kind(raw)}")
            return
        fields = self.struct(raw, _STEP, pointer, where, "", _MALFORMED, _UNKNOWN_FIELD)
        if isinstance(ref := fields.get("ref"), str):
            if not REF_PATTERN.fullmatch(ref):
                self.add(
                    "definition.bad_ref",
                    _ptr(pointer, "ref"),
                    f"{where}: a ref must start with a letter or '_' and hold only letters, "
                    "digits, '_' and '-', at most 64 long",
                )
            first = self.first_index.get(ref)
            if first is not None and first != i:
                self.add(
                    "definition.duplicate_ref",
                    _ptr(pointer, "ref"),
                    f"{where}: ref '{ref}' is already used by steps[{first}]",
                )
        self.reader = (
            ref
            if isinstance(ref, str) and self.first_index.get(ref) == i and self.acyclic
            else None
        )
        self.reader_sees_itself = False
        self.variables = _STEP_VARIABLES
        kind = fields.get("type")
        spec = None
        if isinstance(kind, str):
            spec = self.step_spec(kind, _ptr(pointer, "type"), where, "type")
            if spec is not None and ("args" in fields or "args" not in raw):
                own = ref if isinstance(ref, str) else None
                args = fields.get("args")
                self.args(spec, args, _ptr(pointer, "args"), where, "args.", own)
        self.retry_and_timeout(fields, pointer, where, "", spec)
        self.reader = None
        self.variables = None

    def step_spec(self, kind: str, pointer: str, where: str, label: str) -> StepSpec[Any] | None:
        spec = self.specs.get(kind)
        if spec is None:
            close = difflib.get_close_matches(kind, list(self.specs.names()), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            self.add(
                "definition.unknown_step_type",
                pointer,
                f"{where}: unknown step type {_show(kind)} in '{label}'{hint}",
            )
        return spec

    def retry_and_timeout(
        self,
        fields: dict[str, Any],
        pointer: str,
        where: str,
        prefix: str,
        spec: StepSpec[Any] | None,
    ) -> None:
        """Check a step's (or a SCATTER template's) `retry` and `timeout`: one its
        type does not use is refused as such, and its value is not judged."""
        if spec is not None:
            for name in STEP_OPTIONS:
                if fields.get(name) is None:
                    continue
                unused = _unused_option(spec, name, fields.get("args"), prefix)
                if unused is not None:
                    self.add(
                        _BAD_STEP_OPTION,
                        _ptr(pointer, name),
                        f"{where}: '{prefix}{name}' has no effect on a {spec.type} step{unused}",
                    )
                    fields = {k: v for k, v in fields.items() if k != name}
        retry = fields.get("retry")
        if isinstance(retry, dict):
            self.retry(retry, _ptr(pointer, "retry"), where, prefix + "retry.")
        timeout = fields.get("timeout")
        if isinstance(timeout, str):
            self.duration(timeout, _ptr(pointer, "timeout"), where, prefix + "timeout")

    def retry(self, fields: dict[str, Any], pointer: str, where: str, prefix: str) -> None:
        attempts = fields.get("max_attempts")
        if isinstance(attempts, int) and attempts < 1:
            self.add(
                _BAD_RETRY,
                _ptr(pointer, "max_attempts"),
                f"{where}: '{prefix}max_attempts' counts every attempt and must be at least 1, "
                f"got {attempts}",
            )
        coefficient = fields.get("backoff_coefficient")
        if isinstance(coefficient, int | float) and not (
            math.isfinite(coefficient) and coefficient >= 1
        ):
            self.add(
                _BAD_RETRY,
                _ptr(pointer, "backoff_coefficient"),
                f"{where}: '{prefix}backoff_coefficient' must be a finite number of at least 1, "
                f"got {coefficient}",
            )
        intervals = {}
        for name in ("initial_interval", "max_interval"):
            text = fields.get(name, getattr(_RETRY_DEFAULTS, name))
            if isinstance(text, str) and self.duration(
                text, _ptr(pointer, name), where, prefix + name
            ):
                intervals[name] = self._durations[text]
        if len(intervals) == 2 and intervals["initial_interval"] > intervals["max_interval"]:
            self.add(
                _BAD_RETRY,
                _ptr(pointer, "initial_interval"),
                f"{where}: '{prefix}initial_interval' is longer than '{prefix}max_interval'",
            )
        for j, code in enumerate(fields.get("non_retryable_codes") or []):
            if isinstance(code, str) and not code.strip():
                self.add(
                    _BAD_RETRY,
                    _ptr(pointer, "non_retryable_codes", j),
                    f"{where}: '{prefix}non_retryable_codes[{j}]' must not be empty",
                )

    # step args, per type

    def args(
        self,
        spec: StepSpec[Any],
        raw: dict[str, Any] | None,
        pointer: str,
        where: str,
        prefix: str,
        ref: str | None,
    ) -> None:
        """Check one step's args against its spec; `raw` is None when the step has
        no `args` at all."""
        info = _ARGS.get(spec.args)
        if info is None:
            info = _ARGS[spec.args] = _struct_info(spec.args)
        if raw is None:
            needed = [f.encode_name for f in info.fields if f.required]
            if needed:
                self.add(
                    _BAD_ARGS,
                    pointer,
                    f"{where}: missing '{prefix.rstrip('.')}': a {spec.type} step needs "
                    + ", ".join(f"'{name}'" for name in needed),
                )
                return
            raw = {}
        fields = self.struct(raw, info, pointer, where, prefix, _BAD_ARGS, _BAD_ARGS)
        checked = _Args(self, fields, raw, pointer, where, prefix, ref)
        variables = self.variables
        if BUILTIN_STEP_SPECS.get(spec.type) is not spec:
            # A type the server adds may evaluate its CEL with variables of its own.
            self.variables = None
        try:
            if spec.check is not None:
                try:
                    spec.check(checked)
                except Exception as exc:  # a spec's bug must not turn a report into a crash
                    self.add(
                        _BAD_ARGS,
                        pointer,
                        f"{where}: the {spec.type} args could not be checked"
                        f" ({type(exc).__name__})",
                    )
            checked.expressions(*spec.expressions)
        finally:
            self.variables = variables

    def edge(self, i: int, raw: Any, seen: dict[tuple[str, str, str, str | None], int]) -> None:
        pointer = _ptr("/edges", i)
        where = f"edges[{i}]"
        if isinstance(raw, dict):
            source, target = raw.get("source_ref"), raw.get("target_ref")
            if isinstance(source, str) and isinstance(target, str):
                where = f"edges[{i}] ('{source}' -> '{target}')"
        if not isinstance(raw, dict):
            self.add(_MALFORMED, pointer, f"{where} must be an object, got {_kind(raw)}")
            return
        fields = self.struct(raw, _EDGE, pointer, where, "", _MALFORMED, _UNKNOWN_FIELD)
        source, target = fields.get("source_ref"), fields.get("target_ref")
        known = True
        for name, ref in (("source_ref", source), ("target_ref", target)):
            if self.steps_known and isinstance(ref, str) and ref not in self.first_index:
                known = False
                self.add(
                    "definition.dangling_edge",
                    _ptr(pointer, name),
                    f"{where}: '{name}' names no step: {_show(ref)}",
                )
        kind = fields.get("type", EdgeType.SUCCESS.value)
        edge_type: EdgeType | None = None
        if isinstance(kind, str):
            try:
                edge_type = _EDGE_TYPES[kind]
            except KeyError:
                self.add(
                    "definition.unknown_edge_type",
                    _ptr(pointer, "type"),
                    f"{where}: unknown edge type {_show(kind)}; use one of "
                    + ", ".join(t.value for t in EdgeType),
                )
        condition = fields.get("condition")
        if edge_type is EdgeType.CONDITION and raw.get("condition") is None:
            self.add(
                "definition.condition_missing",
                _ptr(pointer, "condition"),
                f"{where}: an EDGE_TYPE_CONDITION edge needs a 'condition'",
            )
        elif (
            edge_type is not None and edge_type is not EdgeType.CONDITION and condition is not None
        ):
            self.add(
                "definition.condition_unexpected",
                _ptr(pointer, "condition"),
                f"{where}: only an EDGE_TYPE_CONDITION edge takes a 'condition', "
                f"this one is {edge_type.value}",
            )
        elif isinstance(condition, str):
            self.reader = source if isinstance(source, str) and known and self.acyclic else None
            self.reader_sees_itself = True
            self.variables = _CONDITION_VARIABLES
            self.cel(condition, pointer, "condition", where=where, label="condition")
            self.reader = None
            self.variables = None
        if isinstance(source, str) and isinstance(target, str) and known:
            if source == target:
                self.add(
                    "definition.self_loop",
                    pointer,
                    f"{where}: step '{source}' has an edge to itself",
                )
            if isinstance(kind, str):
                key = (source, target, kind, condition if isinstance(condition, str) else None)
                if key in seen:
                    self.add(
                        "definition.duplicate_edge",
                        pointer,
                        f"{where}: repeats edges[{seen[key]}]",
                    )
                else:
                    seen[key] = i

    def trigger(self, i: int, raw: Any) -> None:
        pointer = _ptr("/triggers", i)
        where = f"triggers[{i}]"
        if not isinstance(raw, dict):
            self.add(_MALFORMED, pointer, f"{where} must be an object, got {_kind(raw)}")
            return
        fields = self.struct(raw, _TRIGGER, pointer, where, "", _MALFORMED, _UNKNOWN_FIELD)
        event = fields.get("event")
        if isinstance(event, str) and not event.strip():
            self.add(
                "definition.bad_trigger",
                _ptr(pointer, "event"),
                f"{where}: 'event' must name an event, got an empty string",
            )
        elif isinstance(event, str) and (reason := uncarried_name(event)) is not None:
            # No event can carry the name: the trigger could never fire.
            self.add("definition.bad_trigger", _ptr(pointer, "event"), f"{where}: 'event' {reason}")
        if isinstance(fields.get("filter"), str):
            self.variables = _TRIGGER_VARIABLES
            self.cel(fields["filter"], pointer, "filter", where=where, label="filter")
            self.variables = None

    def concurrency(self, value: Any) -> None:
        if value is None:
            return
        good, fields = self.check(
            value, _CONCURRENCY, "/concurrency", "concurrency", "concurrency", _MALFORMED
        )
        if not good or not isinstance(fields, dict):
            return
        key = fields.get("key")
        if isinstance(key, str) and key.strip():
            self.variables = _KEY_VARIABLES
            self.cel(key, "/concurrency", "key", where="concurrency", label="concurrency.key")
            self.variables = None
        if len(fields) != len(value):
            return  # a part of it is malformed, and reported as such
        try:
            option = msgspec.convert(fields, ConcurrencyOption)
        except msgspec.ValidationError:
            return  # the same, deeper down (in `rate`)
        for pointer, message in option.problems():
            label = "concurrency" + pointer.replace("/", ".")
            self.add(_BAD_CONCURRENCY, "/concurrency" + pointer, f"'{label}' {message}")

    def input_schema(self, value: Any) -> None:
        if value is None:
            return
        if not isinstance(value, dict):
            self.add(
                "definition.bad_input_schema",
                "/input_schema",
                f"'input_schema' must be a JSON Schema object, got {_kind(value)}",
            )
            return
        kind = value.get("type")
        names = kind if isinstance(kind, list) else [kind]
        bad_type = "type" in value and not all(
            isinstance(n, str) and n in _JSON_SCHEMA_TYPES for n in names
        )
        if bad_type:
            self.add(
                "definition.bad_input_schema",
                "/input_schema/type",
                "'input_schema.type' must be a JSON Schema type ("
                + ", ".join(sorted(_JSON_SCHEMA_TYPES))
                + f") or an array of them, got {_show(kind)}",
            )
        # The rest of JSON Schema, and Ductor's bounds on it (`input_schemas`).
        for problem in schema_problems(value):
            if bad_type and problem.pointer == "/type":
                continue  # said above, better
            where = (
                "'input_schema'" if not problem.pointer else "'input_schema' at " + problem.pointer
            )
            self.add(
                "definition.bad_input_schema",
                "/input_schema" + problem.pointer,
                f"{where} {problem.message}",
            )

    def output(self, value: Any) -> None:
        where = ""
        if value is None:
            return
        self.reader = "*" if self.steps_known else None
        self.variables = _STEP_VARIABLES
        self._output(value, where)
        self.reader = None
        self.variables = None

    def _output(self, value: Any, where: str) -> None:
        if isinstance(value, str):
            if not value.strip():
                self.add("definition.bad_output", "/output", "'output' must not be empty")
            else:
                self.cel(value, "/output", where=where, label="output")
            return
        if not isinstance(value, dict):
            self.add(
                "definition.bad_output",
                "/output",
                f"'output' must be a CEL string or an object of CEL strings, got {_kind(value)}",
            )
            return
        if not value:
            self.add(
                "definition.bad_output",
                "/output",
                "'output' must project at least one key (leave it out for the default)",
            )
        for key, source in value.items():
            pointer = _ptr("/output", str(key))
            if not isinstance(source, str):
                self.add(
                    "definition.bad_output",
                    pointer,
                    f"'output.{key}' must be a CEL string, got {_kind(source)}",
                )
            else:
                self.cel(source, pointer, where=where, label=f"output.{key}")

    def graph_problems(self) -> None:
        if not self.steps_known:
            return
        graph = self.graph
        for cycle in self.cycles:
            if len(cycle) == 1:
                continue  # a self-loop, already reported on its edge
            closing = self.edge_index[cycle[-1]]
            self.add(
                "definition.cycle",
                _ptr("/edges", closing),
                f"the steps form a cycle: {graph.describe_cycle(cycle)}",
            )
        reachable = graph.reachable_from_roots()
        for ref in graph.refs:
            if ref not in reachable:
                self.add(
                    "definition.unreachable_step",
                    _ptr("/steps", self.first_index[ref]),
                    f"step '{ref}' can never start: every path into it comes from a cycle, "
                    "not from a starting step (one with no incoming edges)",
                )


class _Args:
    """One step's args under check, as a spec's `check` sees them (an `ArgsCheck`)."""

    __slots__ = ("_walker", "fields", "pointer", "prefix", "raw", "ref", "where")

    def __init__(
        self,
        walker: _Walker,
        fields: dict[str, Any],
        raw: dict[str, Any],
        pointer: str,
        where: str,
        prefix: str,
        ref: str | None,
    ) -> None:
        self._walker = walker
        self.ref = ref
        self.fields = fields
        self.raw = raw
        self.pointer = pointer
        self.where = where
        self.prefix = prefix

    @property
    def specs(self) -> StepSpecs:
        return self._walker.specs

    def at(self, *parts: str | int) -> str:
        return _ptr(self.pointer, *parts)

    def given(self, name: str) -> bool:
        """Whether the raw args set `name` to something other than null."""
        return self.raw.get(name) is not None

    def text(self, name: str) -> str | None:
        value = self.fields.get(name)
        return value if isinstance(value, str) else None

    def value(self, *parts: str) -> Any:
        value: Any = self.fields
        for part in parts:
            if not isinstance(value, dict):
                return None
            value = value.get(part)
        return value

    def problem(self, message: str, *parts: str | int) -> None:
        self._walker.add(_BAD_ARGS, self.at(*parts), f"{self.where}: {message}")

    def expressions(self, *names: str, sees: tuple[str, ...] = ()) -> None:
        w = self._walker
        variables = w.variables
        if sees and variables is not None:
            w.variables = (*variables, *sees)
        try:
            self._expressions(names)
        finally:
            w.variables = variables

    def _expressions(self, names: tuple[str, ...]) -> None:
        w, where, prefix = self._walker, self.where, self.prefix
        for name in names:
            value = self.fields.get(name)
            if isinstance(value, str):
                w.cel(value, self.pointer, name, where=where, label=prefix + name)
            elif isinstance(value, dict):
                for key, source in value.items():
                    if isinstance(source, str):
                        w.cel(
                            source,
                            self.pointer,
                            name,
                            key,
                            where=where,
                            label=f"{prefix}{name}.{key}",
                        )
            elif isinstance(value, list):
                for j, source in enumerate(value):
                    if isinstance(source, str):
                        w.cel(
                            source, self.pointer, name, j, where=where, label=f"{prefix}{name}[{j}]"
                        )

    def expression(self, source: str, *parts: str | int) -> None:
        label = self.prefix + ".".join(str(p) for p in parts)
        self._walker.cel(source, self.pointer, *parts, where=self.where, label=label)

    def duration(self, name: str) -> None:
        text = self.text(name)
        if text is not None:
            self._walker.duration(text, self.at(name), self.where, self.prefix + name)

    def not_blank(self, name: str) -> None:
        self._walker.not_blank(self.fields, name, self.pointer, self.where, self.prefix)

    def slug(self, *parts: str) -> None:
        value = self.value(*parts)
        if isinstance(value, str):
            self._walker.slug(value, self.at(*parts), self.where, self.prefix + ".".join(parts))

    def type_of(self, ref: str) -> str | None:
        if ref not in self._walker.first_index:
            return None
        return self._walker.types.get(ref, "")

    def precedes(self, ref: str) -> bool:
        return self.ref is not None and self._walker.graph.precedes(ref, self.ref)

    def template_spec(self, name: str) -> StepSpec[Any] | None:
        template = self.fields.get(name)
        kind = template.get("type") if isinstance(template, dict) else None
        if not isinstance(kind, str):
            return None
        label = f"{self.prefix}{name}.type"
        return self._walker.step_spec(kind, self.at(name, "type"), self.where, label)

    def template_args(self, name: str, spec: StepSpec[Any]) -> None:
        template, raw_template = self.fields.get(name), self.raw.get(name)
        if not (isinstance(template, dict) and isinstance(raw_template, dict)):
            return
        if "args" in template or "args" not in raw_template:
            args = template.get("args")
            prefix = f"{self.prefix}{name}.args."
            w = self._walker
            variables = w.variables
            if variables is not None:
                w.variables = (*variables, *_ITEM_VARIABLES)  # it runs once per item
            try:
                w.args(spec, args, self.at(name, "args"), self.where, prefix, None)
            finally:
                w.variables = variables

    def template_limits(self, name: str) -> None:
        template = self.fields.get(name)
        if isinstance(template, dict):
            prefix = f"{self.prefix}{name}."
            kind = template.get("type")
            spec = self._walker.specs.get(kind) if isinstance(kind, str) else None
            if spec is not None and not spec.scatterable:
                spec = None  # the type is refused; its options are beside the point
            self._walker.retry_and_timeout(template, self.at(name), self.where, prefix, spec)


# --- leaves -----------------------------------------------------------------------


def _unused_option(spec: StepSpec[Any], name: str, args: Any, prefix: str) -> str | None:
    """None if a step of `spec`'s type with `args` uses its option `name`; else
    the end of the sentence saying it does not ("" or a hint)."""
    if name not in spec.options:
        if spec.start is InCoordinator.SCATTER:
            return f" (set it in '{prefix}args.step', which runs per item)"
        return ""
    if spec.start is InCoordinator.NOTIFY and not (
        isinstance(args, dict) and args.get("await_action") is True
    ):
        return f" without '{prefix}args.await_action': true"
    return None


def _conforms(value: Any, t: mi.Type) -> bool:
    """Whether a scalar (or a list/dict of scalars) has type `t`, as msgspec decides.

    A struct never conforms here: it needs the reporting walk of `_Walker.check`.
    """
    checker = _CHECKERS.get(id(t))
    if checker is None:
        checker = _CHECKERS[id(t)] = _checker(t)
        _CHECKED_TYPES.append(t)  # keeps `id(t)` from being reused
    return checker(value)


# The type checks, compiled once per type: validation runs them for every field.
_CHECKERS: dict[int, Callable[[Any], bool]] = {}
_CHECKED_TYPES: list[mi.Type] = []


def _checker(t: mi.Type) -> Callable[[Any], bool]:
    if isinstance(t, mi.AnyType):
        return lambda value: True
    if isinstance(t, mi.NoneType):
        return lambda value: value is None
    if isinstance(t, mi.BoolType):
        return lambda value: isinstance(value, bool)
    if isinstance(t, mi.IntType):
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if isinstance(t, mi.FloatType):
        return lambda value: isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(t, mi.StrType):
        return lambda value: isinstance(value, str)
    if isinstance(t, mi.LiteralType):
        allowed = t.values
        return lambda value: any(type(value) is type(v) and value == v for v in allowed)
    if isinstance(t, mi.ListType):
        item_type = t.item_type
        return lambda value: (
            isinstance(value, list) and all(_conforms(item, item_type) for item in value)
        )
    if isinstance(t, mi.DictType):
        value_type = t.value_type
        return lambda value: (
            isinstance(value, dict)
            and all(isinstance(k, str) and _conforms(v, value_type) for k, v in value.items())
        )
    if isinstance(t, mi.UnionType):
        members = [_checker(m) for m in t.types]
        return lambda value: any(member(value) for member in members)
    return lambda value: False


def _compile_error(engine: ExpressionEngine, source: str) -> str | None:
    """Why `source` does not compile, or None if it does."""
    if not source.strip():
        return "empty expression"
    try:
        engine.compile(source)
    except ExpressionError as exc:
        cause = exc.__cause__
        line, column = getattr(cause, "line", None), getattr(cause, "column", None)
        if isinstance(line, int) and isinstance(column, int):
            return f"syntax error at line {line}, column {column}"
        message = exc.message.removesuffix(f" (in expression {source!r})")
        return message.split("\n", 1)[0]
    except Exception as exc:  # a parser bug must not turn a report into a crash
        return f"could not be compiled: {type(exc).__name__}"
    return None


def _step_reads(source: str) -> list[str]:
    """The refs a CEL expression reads as `steps.<ref>` or `steps['<ref>']`, in order."""
    if "'" not in source and '"' not in source and "//" not in source:
        # no strings or comments to skip (and no bracket reads): the quick scan
        return list(dict.fromkeys(_PLAIN_STEP_READS.findall(source)))
    refs: dict[str, None] = {}
    for match in _STEP_READS.finditer(source):
        ref = match.group("field") or match.group("single") or match.group("double")
        if ref:
            refs[ref] = None
    return list(refs)


def unseen_variables(
    source: str, variables: Collection[str], functions: Collection[str] = ()
) -> str | None:
    """What is wrong with `source` where only `variables` are given, as the end of a
    sentence ("reads 'steps', but it sees only 'input'"); None when it reads no
    other variable, or is not CEL the parser reads (its compile error says why).

    Args:
        source: a CEL expression that compiles.
        variables: the variables its place evaluates it with.
        functions: the engine's registered function names (`engine.functions.names()`).
    """
    unknown = [name for name in free_variables(source, functions) or () if name not in variables]
    return _unseen(unknown, variables) if unknown else None


def _unseen(unknown: list[str], variables: Collection[str]) -> str:
    read = " and ".join(f"'{name}'" for name in unknown)
    given = [f"'{name}'" for name in variables]
    sees = given[0] if len(given) == 1 else ", ".join(given[:-1]) + " and " + given[-1]
    return f"reads {read}, but it sees only {sees}"


def _lead(where: str) -> str:
    return f"{where}: " if where else ""


def _show(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
