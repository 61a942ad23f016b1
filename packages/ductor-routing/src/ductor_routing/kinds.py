"""Schemas per routable kind and the Validate stage that checks a routable against one.

Validation reports every problem at once, each with a JSON pointer; it never raises.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec

from ductor_routing.routables import Routable


class AttributeType(enum.StrEnum):
    """JSON types an attribute can be required to have."""

    STRING = "string"
    INTEGER = "integer"
    NUMBER = "number"
    BOOLEAN = "boolean"
    OBJECT = "object"
    ARRAY = "array"
    ANY = "any"


class AttributeSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one attribute must look like.

    Attributes:
        type: its JSON type.
        required: whether it must be present.
        enum: the allowed values, when closed.
        minimum: the least allowed number.
        maximum: the greatest allowed number.
    """

    type: AttributeType = AttributeType.ANY
    required: bool = False
    enum: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None


class KindSchema(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The schema of one routable kind.

    Attributes:
        attributes: attribute name to its spec.
        additional: whether attributes not listed are allowed.
        require_consent: the routable must carry granted consent.
        require_price: the routable must carry a price.
    """

    attributes: dict[str, AttributeSpec] = {}
    additional: bool = True
    require_consent: bool = False
    require_price: bool = False


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """One validation problem, located by a JSON pointer into the routable."""

    pointer: str
    message: str


def _type_ok(kind: AttributeType, value: Any) -> bool:
    if kind is AttributeType.ANY:
        return True
    if kind is AttributeType.STRING:
        return isinstance(value, str)
    if kind is AttributeType.INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is AttributeType.NUMBER:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is AttributeType.BOOLEAN:
        return isinstance(value, bool)
    if kind is AttributeType.OBJECT:
        return isinstance(value, dict)
    return isinstance(value, list)


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values: `true` is not `1` nor `false` `0` (Python says they
    are), at any depth; numbers compare by value (`1` is `1.0`)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple | dict) or isinstance(b, list | tuple | dict):
        return False
    return bool(a == b)


def validate_routable(schema: KindSchema | None, routable: Routable) -> tuple[Problem, ...]:
    """Check `routable` against its kind's schema; return every problem (none if valid).

    A kind without a schema is rejected: every routable kind must be declared.
    """
    if schema is None:
        return (Problem(pointer="/kind", message=f"unknown routable kind {routable.kind!r}"),)
    problems: list[Problem] = []
    attrs = routable.attributes
    for name, spec in schema.attributes.items():
        pointer = f"/attributes/{pointer_token(name)}"
        if name not in attrs:
            if spec.required:
                problems.append(Problem(pointer=pointer, message="required attribute is missing"))
            continue
        value = attrs[name]
        if not _type_ok(spec.type, value):
            problems.append(Problem(pointer=pointer, message=f"must be of type {spec.type.value}"))
            continue
        if spec.enum is not None and not any(_json_equal(value, v) for v in spec.enum):
            problems.append(Problem(pointer=pointer, message=f"must be one of {list(spec.enum)!r}"))
        if isinstance(value, int | float) and not isinstance(value, bool):
            if spec.minimum is not None and value < spec.minimum:
                problems.append(Problem(pointer=pointer, message=f"must be >= {spec.minimum:g}"))
            if spec.maximum is not None and value > spec.maximum:
                problems.append(Problem(pointer=pointer, message=f"must be <= {spec.maximum:g}"))
    if not schema.additional:
        for name in sorted(attrs):
            if name not in schema.attributes:
                problems.append(
                    Problem(
                        pointer=f"/attributes/{pointer_token(name)}", message="unknown attribute"
                    )
                )
    if schema.require_consent and (routable.consent is None or not routable.consent.granted):
        problems.append(Problem(pointer="/consent", message="granted consent is required"))
    if routable.price is None:
        if schema.require_price:
            problems.append(Problem(pointer="/price", message="a price is required"))
    elif routable.price < 0:
        # A negative price would charge a member a negative amount; never valid.
        problems.append(Problem(pointer="/price", message="price must be >= 0"))
    return tuple(problems)


def pointer_token(name: str) -> str:
    """`name` as one JSON pointer segment of a `Problem` (RFC 6901: `~` and `/` escaped)."""
    return name.replace("~", "~0").replace("/", "~1")
