"""The variables a CEL expression reads, found on the tree of `_syntax` (the one
the cost estimator walks). Evaluates nothing and imports no CEL library.

A variable is a name the expression reads at its top level: not one a
comprehension macro binds (`x` in `xs.map(x, x * 2)`), and not one either engine
resolves by itself: the CEL type names (`type(x) == int`), `google.protobuf.*`
(cel-python), and the functions, standard, macro or registered (cel-python
reads `size` alone as the function). Of `input.a.b` only `input` is read.
"""

from __future__ import annotations

import functools
from collections.abc import Collection

from ductor_core.expressions._functions import MACROS, STANDARD_FUNCTIONS
from ductor_core.expressions._syntax import (
    Binary,
    Call,
    Conditional,
    Group,
    Ident,
    Index,
    LimitExceeded,
    ListNode,
    MapNode,
    Node,
    Select,
    Unary,
    Unreadable,
    bound_names,
    parse,
)

# What an engine resolves without a variable: the CEL type names both engines
# know, cel-python's `google.protobuf.*` types, and every function.
_RESOLVED = (
    frozenset(
        {"bool", "bytes", "double", "int", "list", "map", "null_type", "string", "type", "uint"}
    )
    | {"google"}
    | STANDARD_FUNCTIONS
    | MACROS
)
# Deep enough for any source the cost limits let compile; a deeper one is not judged.
_MAX_DEPTH = 2_000


def free_variables(source: str, functions: Collection[str] = ()) -> tuple[str, ...] | None:
    """The variables `source` reads, in the order it first reads them.

    Args:
        source: a CEL expression.
        functions: the registered function names (names no variable is read by).

    Returns:
        The names; None when the source is not one the parser reads, or is too
        deep for it (the caller then judges nothing).
    """
    names = _read(source)
    if names is None or not functions:
        return names
    return tuple(name for name in names if name not in functions)


# Validating a definition again (at publish, after a validate) reads the same
# sources: parsing each again would cost more than the rest of the walk.
@functools.lru_cache(maxsize=4096)
def _read(source: str) -> tuple[str, ...] | None:
    try:
        tree, _ = parse(
            source,
            max_tokens=len(source) + 1,
            max_nesting=len(source) + 1,
            max_depth=_MAX_DEPTH,
        )
    except (Unreadable, LimitExceeded, RecursionError):
        return None
    found: dict[str, None] = {}
    # An explicit stack: a tree as tall as the parser allows never recurses here.
    stack: list[tuple[Node, frozenset[str]]] = [(tree, frozenset())]
    while stack:
        node, bound = stack.pop()
        if isinstance(node, Ident):
            name = node.name
            if name not in bound and name not in _RESOLVED:
                found.setdefault(name)
        elif isinstance(node, Select):
            stack.append((node.operand, bound))
        elif isinstance(node, Index):
            stack.extend(((node.index, bound), (node.operand, bound)))
        elif isinstance(node, Unary):
            stack.append((node.operand, bound))
        elif isinstance(node, Binary):
            stack.extend(((node.right, bound), (node.left, bound)))
        elif isinstance(node, Conditional):
            stack.extend(((node.otherwise, bound), (node.then, bound), (node.condition, bound)))
        elif isinstance(node, Group):
            stack.append((node.inner, bound))
        elif isinstance(node, ListNode):
            stack.extend((item, bound) for item in reversed(node.items))
        elif isinstance(node, MapNode):
            for key, value in reversed(node.entries):
                stack.extend(((value, bound), (key, bound)))
        elif isinstance(node, Call):
            names = bound_names(node)
            inner = bound if names is None else bound | set(names)
            body = node.args[len(names) :] if names is not None else node.args
            stack.extend((arg, inner) for arg in reversed(body))
            if node.target is not None:
                stack.append((node.target, bound))
    return tuple(found)
