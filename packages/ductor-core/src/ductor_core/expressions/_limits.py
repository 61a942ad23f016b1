"""Limits every engine applies to an expression before compiling it.

Holds the checks only; it imports no CEL library.
"""

from __future__ import annotations

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
