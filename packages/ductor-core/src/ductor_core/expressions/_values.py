"""JSON values on the way into and out of a CEL engine, engine-neutral.

Holds the range checks and the one `to_json` used by every engine; it imports no
CEL library, so both engines produce results through exactly the same code.
"""

from __future__ import annotations

import base64
import datetime
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from ductor_core.expressions._limits import MAX_VALUE_DEPTH

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

# CEL type names for the engine-side classes that `type(x)` can return.
_TYPE_NAMES = {
    "IntType": "int",
    "UintType": "uint",
    "DoubleType": "double",
    "BoolType": "bool",
    "StringType": "string",
    "BytesType": "bytes",
    "ListType": "list",
    "MapType": "map",
    "NoneType": "null_type",
    "NullType": "null_type",
    "TimestampType": "google.protobuf.Timestamp",
    "DurationType": "google.protobuf.Duration",
    "TypeType": "type",
}


# What cel-rust pays to copy a value, in list items (about 80 ns each): a map
# entry about three, a string one per 512 characters (measured).
_ENTRY_WEIGHT = 3
_CHARS_PER_WEIGHT = 512


class ValueConversionError(ValueError):
    """A value that has no lossless CEL or JSON form (the engines wrap it)."""


# A lone surrogate (U+D800..U+DFFF) is not Unicode text: it has no UTF-8 form,
# cel-rust cannot take it and no JSON encoder can write it.
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_text(value: str) -> str:
    """Return `value` if it is Unicode text (no lone surrogate), else raise."""
    # isascii() is O(1) in CPython: the common case costs no scan.
    if not value.isascii():
        found = _SURROGATE.search(value)
        if found is not None:
            raise ValueConversionError(
                f"string holds a lone surrogate (U+{ord(found.group()):04X} at index"
                f" {found.start()}), which is not Unicode text"
            )
    return value


def check_int(value: int) -> int:
    """Return `value` if CEL can hold it exactly (int64 or uint64), else raise."""
    if INT64_MIN <= value <= UINT64_MAX:
        return value
    raise ValueConversionError(
        f"integer {value} is outside the CEL range [-2**63, 2**64 - 1]; pass it as a string"
    )


def require_utc(value: datetime.datetime) -> datetime.datetime:
    """Return `value` in UTC; a naive datetime is refused (times are always UTC)."""
    if value.tzinfo is None:
        raise ValueConversionError(f"naive datetime {value.isoformat()} has no time zone")
    return value.astimezone(datetime.UTC)


def format_timestamp(value: datetime.datetime) -> str:
    """RFC 3339 in UTC with a `Z`, and 0, 3 or 6 fraction digits as needed."""
    utc = require_utc(value)
    # Not strftime: it writes year 1 as "1", not "0001".
    base = (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}"
        f"T{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    )
    micros = utc.microsecond
    if micros == 0:
        return base + "Z"
    if micros % 1000 == 0:
        return f"{base}.{micros // 1000:03d}Z"
    return f"{base}.{micros:06d}Z"


def format_duration_seconds(value: datetime.timedelta) -> str:
    """A duration the way protobuf JSON writes it: seconds with an `s` (`"90s"`, `"1.5s"`)."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), 1_000_000)
    if frac == 0:
        return f"{sign}{whole}s"
    return f"{sign}{whole}.{frac:06d}".rstrip("0") + "s"


def map_key(value: Any) -> str:
    """A CEL map key (string, int, uint or bool) as a JSON object key."""
    if isinstance(value, str):
        return check_text(str(value))
    if isinstance(value, bool) or type(value).__name__ == "BoolType":
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    raise ValueConversionError(f"map key of type {type(value).__name__} has no JSON form")


def to_json(value: Any) -> Any:
    """Convert a CEL result (from any engine) to plain JSON-compatible Python.

    ints (and uints) stay `int`, doubles `float`, strings `str`, null `None`;
    lists and maps recurse (map keys become strings: `1` -> `"1"`, `true` ->
    `"true"`, and come out sorted); timestamps become RFC 3339 strings
    ending in `Z`; durations become seconds strings (`"90s"`); bytes become
    standard base64; a CEL type value becomes its CEL name (`"int"`, ...).

    Raises:
        ValueConversionError: for a value with no JSON form.
    """
    if value is None:
        return None
    # bools before ints: `bool` and cel-python's `BoolType` both subclass int.
    if isinstance(value, bool) or type(value).__name__ == "BoolType":
        return bool(value)
    if isinstance(value, str):
        return check_text(str(value))
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Mapping):
        # Sorted keys: cel-rust returns maps in hash order, which changes from
        # one process to the next; results must not.
        pairs = sorted(((map_key(k), v) for k, v in value.items()), key=lambda kv: kv[0])
        return {key: to_json(item) for key, item in pairs}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, datetime.datetime):
        return format_timestamp(value)
    if isinstance(value, datetime.timedelta):
        return format_duration_seconds(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, type):
        return _TYPE_NAMES.get(value.__name__, value.__name__)
    if type(value).__name__ == "NullType":
        return None
    raise ValueConversionError(f"value of type {type(value).__name__} has no JSON form")


class Sizes:
    """What `to_plain` measured of the values it walked, for the cost check.

    Attributes:
        items: the most items of any list or map (map keys included).
        chars: the longest string or bytes.
        heft: the most any list weighs for cel-rust to rebuild item by item: its
            length times what its items hold in all (`weight`); 0 without lists.
        weight: what the values walked so far hold: 1 per list item, 3 per map
            entry and 1 per 512 characters, at any depth (a running count).
    """

    __slots__ = ("chars", "heft", "items", "weight")

    def __init__(self) -> None:
        self.items = 0
        self.chars = 0
        self.heft = 0
        self.weight = 0

    def pair(self) -> tuple[int, int]:
        """(items, chars)."""
        return self.items, self.chars


def to_plain(value: Any, depth: int = 0, sizes: Sizes | None = None) -> Any:
    """Check and copy an activation value into plain Python an engine can take.

    JSON values pass (ints are range-checked), tuples become lists, mappings
    become dicts, tz-aware datetimes become UTC timestamps, timedeltas
    durations, bytes stay bytes; a msgspec Struct is converted to builtins
    first. Anything else is refused. A value that needs no change is returned
    as it is (no copy), which keeps the common case cheap.

    Args:
        value: the value.
        depth: how deep `value` already is.
        sizes: filled in with the longest list and string met, and what the
            lists weigh, if given.

    Raises:
        ValueConversionError: for an int out of range, a naive datetime, a
            string with a lone surrogate, a value that is not JSON, or lists
            and maps nested deeper than MAX_VALUE_DEPTH.
    """
    kind = type(value)
    if kind is str:
        if sizes is not None:
            length = len(value)
            if length > sizes.chars:
                sizes.chars = length
            if length >= _CHARS_PER_WEIGHT:
                sizes.weight += length // _CHARS_PER_WEIGHT
        return check_text(value)
    if kind is bool or kind is float or value is None:
        return value
    if kind is int:
        if INT64_MIN <= value <= UINT64_MAX:
            return value
        return check_int(value)
    if depth >= MAX_VALUE_DEPTH and (kind is dict or kind is list):
        raise ValueConversionError(f"value nested deeper than {MAX_VALUE_DEPTH} levels")
    if kind is dict:
        if sizes is not None:
            if len(value) > sizes.items:
                sizes.items = len(value)
            sizes.weight += _ENTRY_WEIGHT * len(value)
        copy: dict[Any, Any] | None = None
        for key, item in value.items():
            plain = to_plain(item, depth + 1, sizes)
            if type(key) is str:
                check_text(key)
            else:
                if not isinstance(key, str | int):
                    raise ValueConversionError(f"map key {key!r} is not a string, int or bool")
                if isinstance(key, str):
                    check_text(key)
                elif not isinstance(key, bool):
                    check_int(key)
            if sizes is not None and isinstance(key, str) and len(key) > sizes.chars:
                sizes.chars = len(key)
            if plain is not item and copy is None:
                copy = dict(value)
            if copy is not None:
                copy[key] = plain
        return value if copy is None else copy
    if kind is list:
        start = 0
        if sizes is not None:
            if len(value) > sizes.items:
                sizes.items = len(value)
            start = sizes.weight
            sizes.weight = start + len(value)
        items: list[Any] | None = None
        for index, item in enumerate(value):
            plain = to_plain(item, depth + 1, sizes)
            if plain is not item and items is None:
                items = list(value)
            if items is not None:
                items[index] = plain
        if sizes is not None:
            heft = len(value) * (sizes.weight - start)
            if heft > sizes.heft:
                sizes.heft = heft
        return value if items is None else items
    return _to_plain_other(value, depth, sizes)


def _to_plain_other(value: Any, depth: int, sizes: Sizes | None) -> Any:
    # Subclasses and the less common types, off the fast path.
    if isinstance(value, str | bytes):
        if sizes is not None:
            sizes.chars = max(sizes.chars, len(value))
            sizes.weight += len(value) // _CHARS_PER_WEIGHT
        return check_text(value) if isinstance(value, str) else value
    if isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return check_int(value)
    if isinstance(value, Mapping):
        return to_plain(dict(value), depth, sizes)
    if isinstance(value, list | tuple):
        return to_plain(list(value), depth, sizes)
    if isinstance(value, datetime.datetime):
        return require_utc(value)
    if isinstance(value, datetime.timedelta):
        return value
    if isinstance(value, msgspec.Struct):
        builtins = msgspec.to_builtins(value, builtin_types=(datetime.datetime, bytes))
        return to_plain(builtins, depth, sizes)
    raise ValueConversionError(f"value of type {type(value).__name__} is not JSON")
