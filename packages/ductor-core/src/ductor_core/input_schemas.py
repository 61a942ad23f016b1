"""A workflow's `input_schema`: checked as a JSON Schema when a definition is
validated, and a run's input checked against it when the run starts. Pure: no
I/O, no clock; a `$ref` is never fetched.

The dialect is JSON Schema draft 2020-12, or the draft `$schema` names (2019-09,
draft-07 or draft-06). What a schema may hold is bounded, so that checking an
input can never cost a tenant's neighbours much:

- at most `MAX_SCHEMA_BYTES` of JSON, nested at most `MAX_SCHEMA_DEPTH` deep;
- a `$ref` points inside the schema (`#`, `#/$defs/item`); `$id`, `$anchor`,
  `$dynamicRef`, `$dynamicAnchor`, `$recursiveRef` and `$recursiveAnchor` are
  refused, so no reference can leave the document;
- a `pattern` is RE2 syntax (no lookaround, no backreference), at most
  `MAX_PATTERN_CHARS` long, and is matched in time linear in the string: no
  pattern can backtrack for ever. `patternProperties` is refused (the library
  matches its patterns with Python's backtracking `re`);
- `format` is an annotation, not checked (the draft's default).

Checking an input counts its work in steps (a keyword applied to a value, a
value of a `uniqueItems` array, 256 characters a `pattern` reads...). A check
may take `MIN_STEPS` plus `STEPS_PER_VALUE` for each value in the input (a
schema that does a bounded amount of work per value never reaches it); one
that would take more stops, and the input is refused with a problem saying so.
Recursion deeper than Python allows is refused the same way.

The checks themselves, and the JSON Schema library they run on, live in
`ductor_core._json_schema`, imported the first time a schema is checked: a
process whose workflows have no input schema never loads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

MAX_SCHEMA_BYTES = 64 * 1024
"""The most JSON an input schema may take."""
MAX_SCHEMA_DEPTH = 32
"""How deeply objects and arrays may nest in an input schema."""
MAX_PATTERN_CHARS = 1000
"""The longest `pattern` an input schema may hold."""
MAX_PROBLEMS = 20
"""The most problems a refused input (or schema) lists."""
MAX_MESSAGE_CHARS = 200
"""The longest a problem's message gets; a longer one is cut with an ellipsis."""
MIN_STEPS = 10_000
"""The steps a check of any input may take."""
STEPS_PER_VALUE = 25
"""The further steps a check may take for each value (object, array, string,
number, boolean or null) in the input."""


class InputProblem(msgspec.Struct, frozen=True, kw_only=True):
    """One way a value fails its schema (or a schema fails to be one).

    Attributes:
        pointer: an RFC 6901 pointer to the value at fault, from the root given
            to the check (e.g. "/input/total").
        message: what is wrong, for people.
    """

    pointer: str
    message: str


class InputCheck(msgspec.Struct, frozen=True, kw_only=True):
    """What checking a value against a schema found.

    Attributes:
        problems: at most `MAX_PROBLEMS` of them, in the order found.
        complete: False when the check ran out of steps first (its last problem
            says so); a value that was not checked to the end is not valid.
    """

    problems: tuple[InputProblem, ...] = ()
    complete: bool = True

    @property
    def valid(self) -> bool:
        """Whether the value satisfies the schema."""
        return self.complete and not self.problems


def schema_problems(schema: Any) -> list[InputProblem]:
    """Every problem of `schema` as an input schema, with pointers from its root
    (""): at most `MAX_PROBLEMS`. An empty list means runs can be checked against it."""
    from ductor_core import _json_schema

    return _json_schema.schema_problems(schema)


def input_steps(value: Any) -> int:
    """The steps a check of `value` may take: `MIN_STEPS` plus `STEPS_PER_VALUE`
    per value in it (counted without recursion)."""
    count = 0
    stack = [value]
    while stack:
        item = stack.pop()
        count += 1
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return MIN_STEPS + STEPS_PER_VALUE * count


def check_input(
    schema: Mapping[str, Any], value: Any, *, steps: int | None = None, root: str = "/input"
) -> InputCheck:
    """Check `value` against `schema`.

    A schema `schema_problems` refuses (one a version published before these
    checks may hold) is not run: the value is taken as valid.

    Args:
        schema: the input schema.
        value: the run's input.
        steps: the most steps the check may take (`input_steps(value)` if None).
        root: the pointer of `value` itself; each problem's pointer starts with it.
    """
    from ductor_core import _json_schema

    budget = input_steps(value) if steps is None else steps
    return _json_schema.check_input(schema, value, steps=budget, root=root)


__all__ = [
    "MAX_MESSAGE_CHARS",
    "MAX_PATTERN_CHARS",
    "MAX_PROBLEMS",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MIN_STEPS",
    "STEPS_PER_VALUE",
    "InputCheck",
    "InputProblem",
    "check_input",
    "input_steps",
    "schema_problems",
]
