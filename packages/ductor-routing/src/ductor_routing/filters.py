"""Structured filters compiled to plain Python predicates, and the index over them.

These are the cheap pre-filters: no CEL, no allocation per check, and `eq`/`in`
filters indexed by value so a large pool is narrowed by one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from ductor_routing.pools import Filter, FilterOp

MISSING: Any = object()
"""Returned by a getter when the attribute is absent."""

Getter = Callable[[Mapping[str, Any]], Any]
Predicate = Callable[[Mapping[str, Any]], bool]


def attribute_getter(path: str) -> Getter:
    """A function reading the dotted `path` from attributes, or MISSING."""
    parts = path.split(".")
    if len(parts) == 1:
        name = parts[0]

        def get_one(attrs: Mapping[str, Any]) -> Any:
            return attrs.get(name, MISSING)

        return get_one

    def get_path(attrs: Mapping[str, Any]) -> Any:
        value: Any = attrs
        for part in parts:
            if not isinstance(value, Mapping):
                return MISSING
            value = value.get(part, MISSING)
            if value is MISSING:
                return MISSING
        return value

    return get_path


def _comparable(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    if isinstance(a, int | float) and isinstance(b, int | float):
        return True
    return isinstance(a, str) and isinstance(b, str)


_ORDERED = (FilterOp.GT, FilterOp.GTE, FilterOp.LT, FilterOp.LTE)
_LISTED = (FilterOp.IN, FilterOp.NOT_IN)


def filter_problems(spec: Filter) -> list[tuple[str, str]]:
    """What is wrong with `spec` as (pointer below the filter, message): a filter
    that could never do what it says (an `in` given a `value`, which it ignores,
    so it matched nothing) is a configuration problem, not a silent miss."""
    found: list[tuple[str, str]] = []
    if not all(part.strip() for part in spec.attribute.split(".")):
        found.append(("/attribute", "must be a dotted path of non-empty names"))
    op = spec.op.value
    if spec.op in _LISTED:
        if spec.value is not None:
            found.append(("/value", f"{op!r} takes a list in 'values', not a 'value'"))
    elif spec.values:
        found.append(("/values", f"{op!r} takes one 'value', not 'values'"))
    if spec.op in _ORDERED and (
        isinstance(spec.value, bool) or not isinstance(spec.value, int | float | str)
    ):
        found.append(("/value", f"{op!r} compares with a number or a string"))
    if spec.op is FilterOp.EXISTS and spec.value is not None and not isinstance(spec.value, bool):
        found.append(("/value", "'exists' takes true, false or no value"))
    return found


def compile_filter(spec: Filter) -> Predicate:
    """A predicate over attributes that holds when `spec` does.

    A missing attribute fails every operator except `ne`, `not_in` and
    `exists` with value false.
    """
    get = attribute_getter(spec.attribute)
    op = spec.op
    operand = spec.value
    if op is FilterOp.EQ:
        want = _key(operand)
        return lambda attrs: _key(get(attrs)) == want
    if op is FilterOp.NE:
        unwanted = _key(operand)
        return lambda attrs: _key(get(attrs)) != unwanted
    if op is FilterOp.IN:
        allowed = _value_set(spec.values)
        return lambda attrs: _member(get(attrs), allowed)
    if op is FilterOp.NOT_IN:
        denied = _value_set(spec.values)
        return lambda attrs: not _member(get(attrs), denied)
    if op is FilterOp.EXISTS:
        want = operand is None or bool(operand)
        return lambda attrs: (get(attrs) is not MISSING) is want

    def compare(attrs: Mapping[str, Any]) -> bool:
        value = get(attrs)
        if value is MISSING or not _comparable(value, operand):
            return False
        if op is FilterOp.GT:
            return bool(value > operand)
        if op is FilterOp.GTE:
            return bool(value >= operand)
        if op is FilterOp.LT:
            return bool(value < operand)
        return bool(value <= operand)

    return compare


def describe_filter(spec: Filter) -> str:
    """A short human reading of the filter, e.g. "state in ['CA', 'NV']"."""
    if spec.op in (FilterOp.IN, FilterOp.NOT_IN):
        return f"{spec.attribute} {spec.op.value.replace('_', ' ')} {list(spec.values)!r}"
    if spec.op is FilterOp.EXISTS:
        return (
            f"{spec.attribute} exists"
            if spec.value in (None, True)
            else (f"{spec.attribute} absent")
        )
    symbol = {
        FilterOp.EQ: "==",
        FilterOp.NE: "!=",
        FilterOp.GT: ">",
        FilterOp.GTE: ">=",
        FilterOp.LT: "<",
        FilterOp.LTE: "<=",
    }[spec.op]
    return f"{spec.attribute} {symbol} {spec.value!r}"


def _key(value: Any) -> Hashable:
    """The index key of a JSON value: bool kept apart from int, as JSON does."""
    key: Hashable = value
    kind = type(value)
    if kind is str or kind is int or kind is float or value is None:
        return key
    if kind is bool:
        return ("bool", value)
    try:
        hash(value)
    except TypeError:
        return ("unhashable", repr(value))
    return key


def _value_set(values: Sequence[Any]) -> frozenset[Hashable]:
    return frozenset(_key(v) for v in values)


def _member(value: Any, keys: frozenset[Hashable]) -> bool:
    return value is not MISSING and _key(value) in keys


def index_key(value: Any) -> Hashable:
    """The key a value is looked up by in an index built from `index_values`."""
    return _key(value)


def is_indexable(spec: Filter) -> bool:
    """Whether the filter can be answered by a value index (eq and in)."""
    return spec.op in (FilterOp.EQ, FilterOp.IN)


def index_values(spec: Filter) -> tuple[Hashable, ...]:
    """The index keys an indexable filter accepts."""
    if spec.op is FilterOp.EQ:
        return (_key(spec.value),)
    return tuple(_key(v) for v in spec.values)


_Split = tuple[frozenset[int], tuple[int, ...], tuple[int, ...], tuple[str, ...]]


class AttributeIndex:
    """For one attribute, which item positions accept each value.

    Items with no indexed filter on the attribute accept every value. The
    kept and dropped positions for each known value are computed once, in
    the items' order, so narrowing the full set costs one lookup.
    """

    __slots__ = ("_by_value", "_labels", "_unknown", "attribute", "get", "positions")

    def __init__(
        self,
        attribute: str,
        accepts: Mapping[int, frozenset[Hashable] | None],
        labels: Sequence[str] = (),
    ) -> None:
        """Build from item position -> accepted keys (None: accepts anything).

        `labels` (item names by position) lets `lookup` return the dropped
        items' names, prebuilt, without a per-call loop.
        """
        self.attribute = attribute
        self._labels = labels
        self.get = attribute_getter(attribute)
        self.positions = tuple(sorted(accepts))
        open_positions = frozenset(p for p, keys in accepts.items() if keys is None)
        values: set[Hashable] = set()
        for keys in accepts.values():
            if keys is not None:
                values.update(keys)
        by_value: dict[Hashable, _Split] = {}
        for value in values:
            allowed = open_positions | frozenset(
                p for p, keys in accepts.items() if keys is not None and value in keys
            )
            by_value[value] = self._split(allowed)
        self._by_value = by_value
        self._unknown = self._split(open_positions)

    def _split(self, allowed: frozenset[int]) -> _Split:
        kept = tuple(p for p in self.positions if p in allowed)
        dropped = tuple(p for p in self.positions if p not in allowed)
        names = tuple(self._labels[p] for p in dropped) if self._labels else ()
        return allowed, kept, dropped, names

    def lookup(self, attrs: Mapping[str, Any]) -> _Split:
        """(allowed set, kept positions, dropped positions, dropped labels) for these attributes."""
        value = self.get(attrs)
        if value is MISSING:
            return self._unknown
        return self._by_value.get(_key(value), self._unknown)
