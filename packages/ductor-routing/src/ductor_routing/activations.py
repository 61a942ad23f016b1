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
