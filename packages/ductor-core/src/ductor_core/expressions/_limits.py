"""Limits every engine applies to an expression: its length, and its cost (`CostLimits`).

Holds the limits and the length check only; it imports no CEL library.
"""

from __future__ import annotations

from dataclasses import dataclass

from ductor_core.errors import ExpressionError

# cel-rust overflows its native stack (the process dies) on very long operator
# chains, from about 20,000 terms; cel-python fails with RecursionError from
# about 500. Expressions come from users, so the length is capped far below
# the crash: 8,192 characters is at most about 4,000 chained terms.
MAX_SOURCE_LENGTH = 8192

# cel-rust also dies converting values nested about 10,000 deep (fine at
# 2,000); Python recursion is the other bound. JSON from outside is capped at
# 128 levels of lists and maps, far more than any real payload.
MAX_VALUE_DEPTH = 128


def check_source(source: object) -> str:
    """Return `source` if an engine may compile it; raise otherwise.

    Raises:
        TypeError: `source` is not a string.
        ExpressionError: `expression.syntax` when longer than MAX_SOURCE_LENGTH.
    """
    if not isinstance(source, str):
        raise TypeError("a CEL expression is a string")
    if len(source) > MAX_SOURCE_LENGTH:
        raise ExpressionError(
            f"expression is {len(source)} characters long; the limit is {MAX_SOURCE_LENGTH}",
            expression=source[:80] + "...",
            code="expression.syntax",
        )
    return source


@dataclass(frozen=True, slots=True)
class CostLimits:
    """How costly an expression may be; one set per engine (see docs/expressions.md).

    An expression over any limit is refused with `expression.too_costly`, at
    compile time from its static estimate and, when its variables are larger
    than assumed, again before it is evaluated.

    Attributes:
        max_cost: the largest estimated cost accepted, in units of about one
            node evaluated (a comprehension counts its body once per item).
        max_tokens: the most tokens a source may have; checked before the
            engine's parser sees it (cel-python parses about 20,000 a second).
        max_nesting: how deep brackets (`(`, `[`, `{`) may nest; cel-python
            runs out of Python stack evaluating about 45 levels.
        max_depth: the tallest tree accepted, one level per operator in a
            chain; cel-python runs out of stack on chains of about 250.
        assumed_items: the items assumed for every list or map read from a
            variable (and every list inside one), for the static estimate.
        assumed_chars: the characters assumed for every string from a variable.
        max_string_length: the longest string (or bytes) an expression may build.
        max_list_length: the longest list or map an expression may build.
        max_steps: cel-python only: the most tree nodes one evaluation may
            visit; past it the evaluation stops with `expression.too_costly`.
            None (the default) is `STEPS_PER_COST` times `max_cost`: a unit
            of the estimate is at most about ten visits, so an expression
            within its estimate never meets this limit.
    """

    max_cost: int = 1_000_000
    max_tokens: int = 1_000
    max_nesting: int = 24
    max_depth: int = 64
    assumed_items: int = 100
    assumed_chars: int = 1_000
    max_string_length: int = 1_000_000
    max_list_length: int = 100_000
    max_steps: int | None = None

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if name == "max_steps" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CostLimits.{name} must be a positive int, got {value!r}")

    @property
    def step_limit(self) -> int:
        """The step limit in force: `max_steps`, or `STEPS_PER_COST` times `max_cost`."""
        return self.max_steps if self.max_steps is not None else STEPS_PER_COST * self.max_cost


STEPS_PER_COST = 20
"""cel-python steps allowed per unit of `max_cost` when `max_steps` is not set."""


DEFAULT_COST_LIMITS = CostLimits()
"""The limits an engine built without `limits=` applies."""
