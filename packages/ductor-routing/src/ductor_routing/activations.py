"""The variables routing CEL expressions see, and which of them an expression can reach.

Building an activation is pure; converting it is the engine's job (and its
main cost), so only the variables an expression names are included.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from typing import Any

from ductor_routing.routables import Routable

VARIABLES = ("routable", "attributes", "now", "worker", "member")
"""Every name a routing expression may use; `worker` and `member` only in member conditions."""

_VARIABLE = re.compile(r"\b(routable|attributes|now|worker|member)\b")


def referenced_variables(sources: Iterable[str | None]) -> frozenset[str]:
    """The activation variables these CEL sources can reach.

    CEL has no dynamic variable lookup, so a name that does not appear in the
    text cannot be read; leaving it out of the activation saves converting it.
    """
    names: set[str] = set()
    for source in sources:
        if source is not None:
            names.update(_VARIABLE.findall(source))
    return frozenset(names)


_ATTRIBUTE_USE = re.compile(r"\battributes\b(\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)\b(?!\s*\())?")


def _is_field_of_something_else(source: str, start: int) -> bool:
    # `routable.attributes` is a field of `routable`, not the `attributes`
    # variable; a leading dot with nothing before it (`.attributes`) is the variable.
    i = start - 1
    while i >= 0 and source[i].isspace():
        i -= 1
    if i < 0 or source[i] != ".":
        return False
    i -= 1
    while i >= 0 and source[i].isspace():
        i -= 1
    return i >= 0 and (source[i].isalnum() or source[i] in "_)]")


def referenced_attributes(sources: Iterable[str | None]) -> frozenset[str] | None:
    """The attribute names these sources read through `attributes.NAME`.

    None when some use of `attributes` is anything else (indexing, a macro on
    the whole map, a method call), in which case all attributes are needed.
    """
    names: set[str] = set()
    for source in sources:
        if source is None:
            continue
        for match in _ATTRIBUTE_USE.finditer(source):
            if _is_field_of_something_else(source, match.start()):
                continue
            if match.group(2) is None:
                return None
            names.add(match.group(2))
    return frozenset(names)


class Activations:
    """Builds the activation for one family of expressions (rules, or member conditions).

    Args:
        sources: the CEL sources that will be evaluated against it.
    """

    __slots__ = ("_attributes", "names")

    def __init__(self, sources: Iterable[str | None]) -> None:
        listed = list(sources)
        self.names = referenced_variables(listed)
        self._attributes = referenced_attributes(listed)

    def build(self, routable: Routable, now: datetime.datetime) -> dict[str, Any]:
        """`routable`, `attributes` (only the names read, when known) and `now`, as needed."""
        activation = routable_activation(self.names - {"attributes"}, routable, now)
        if "attributes" in self.names:
            attrs = routable.attributes
            wanted = self._attributes
            if wanted is None:
                activation["attributes"] = attrs
            else:
                activation["attributes"] = {k: attrs[k] for k in wanted if k in attrs}
        return activation


def routable_activation(
    names: frozenset[str], routable: Routable, now: datetime.datetime
) -> dict[str, Any]:
    """`routable`, `attributes` and `now` (a UTC timestamp), those of them in `names`."""
    activation: dict[str, Any] = {}
    if "routable" in names:
        activation["routable"] = routable.activation()
    if "attributes" in names:
        activation["attributes"] = routable.attributes
    if "now" in names:
        activation["now"] = now.astimezone(datetime.UTC)
    return activation
