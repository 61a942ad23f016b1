"""The function registry: custom CEL functions over JSON values, and the built-ins.

A function is registered once, by name, with a Python implementation that takes
and returns JSON values; every engine exposes it. Implementations must be pure:
no I/O, no clock, no randomness.
"""

from __future__ import annotations

import datetime
import re
import threading
import zoneinfo
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ductor_core.expressions._values import INT64_MAX, INT64_MIN, UINT64_MAX, map_key

JsonFunction = Callable[..., Any]

# The timestamp accessor methods of the CEL standard, as in `ts.getHours()`.
TIMESTAMP_ACCESSORS = (
    "getFullYear",
    "getMonth",
    "getDate",
    "getDayOfMonth",
    "getDayOfWeek",
    "getDayOfYear",
    "getHours",
    "getMinutes",
    "getSeconds",
    "getMilliseconds",
)

# Functions of the CEL standard both engines implement the same way. An
# expression may call these, the macros and registered functions, nothing else.
STANDARD_FUNCTIONS = frozenset(
    {
        "size",
        "contains",
        "startsWith",
        "endsWith",
        "matches",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "timestamp",
        "duration",
        "type",
        "dyn",
    }
    | set(TIMESTAMP_ACCESSORS)
)
MACROS = frozenset({"has", "all", "exists", "exists_one", "existsOne", "map", "filter"})
_RESERVED = frozenset(
    {
        "bool",
        "null",
        "true",
        "false",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
        "list",
        "map",
        "null_type",
        "optional",
    }
)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True, slots=True)
class CustomFunction:
    """One registered function: its CEL name, implementation and a line of docs."""

    name: str
    impl: JsonFunction
    doc: str


class FunctionRegistry:
    """Custom CEL functions by name; the one extension point for functions.

    Engines take a registry when they are built and read it then: register
    every function before building the engine that should expose it.
    Registration is guarded by a lock; lookups need none.
    """

    def __init__(self, functions: Mapping[str, CustomFunction] | None = None) -> None:
        self._functions: dict[str, CustomFunction] = dict(functions or {})
        self._lock = threading.Lock()

    def register(self, name: str, impl: JsonFunction, *, doc: str = "") -> None:
        """Register `impl` as the CEL function `name`.

        Args:
            name: a CEL identifier, not a standard function, macro or keyword.
            impl: called with JSON values (ints, floats, strings, bools,
                None, lists, dicts; timestamps arrive as RFC 3339 strings);
                returns a JSON value. Raising any exception makes the call a
                CEL evaluation error.
            doc: one line for the function list in the docs.

        Raises:
            ValueError: bad or reserved name, or already registered.
        """
        if not _IDENTIFIER.match(name):
            raise ValueError(f"function name {name!r} is not a CEL identifier")
        if name in STANDARD_FUNCTIONS or name in MACROS or name in _RESERVED:
            raise ValueError(f"function name {name!r} is reserved by CEL")
        with self._lock:
            if name in self._functions:
                raise ValueError(f"function {name!r} is already registered")
            self._functions[name] = CustomFunction(name=name, impl=impl, doc=doc)

    def function(self, name: str, *, doc: str = "") -> Callable[[JsonFunction], JsonFunction]:
        """Decorator form of `register`."""

        def decorate(impl: JsonFunction) -> JsonFunction:
            self.register(name, impl, doc=doc)
            return impl

        return decorate

    def copy(self) -> FunctionRegistry:
        """An independent registry holding the same functions."""
        with self._lock:
            return FunctionRegistry(self._functions)

    def names(self) -> frozenset[str]:
        """The registered names."""
        return frozenset(self._functions)

    def __getitem__(self, name: str) -> CustomFunction:
        return self._functions[name]

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def __iter__(self) -> Iterator[CustomFunction]:
        return iter(list(self._functions.values()))

    def __len__(self) -> int:
        return len(self._functions)


def _need(value: Any, kind: type | tuple[type, ...], what: str, fn: str) -> None:
    # bool is an int in Python but never a number in CEL.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TypeError(f"{fn}() wants {what}, got bool")
    if not isinstance(value, kind):
        raise TypeError(f"{fn}() wants {what}, got {type(value).__name__}")


def _lower(s: Any) -> str:
    _need(s, str, "a string", "lower")
    return str(s).lower()


def _upper(s: Any) -> str:
    _need(s, str, "a string", "upper")
    return str(s).upper()


def _trim(s: Any) -> str:
    _need(s, str, "a string", "trim")
    return str(s).strip()


def _key(key: Any) -> str | None:
    # A map reaches a function with its keys as strings (1 -> "1", true -> "true"):
    # look a key up the same way. Other values are never keys.
    return map_key(key) if isinstance(key, str | int) else None


def _has_key(m: Any, key: Any) -> bool:
    _need(m, dict, "a map", "has_key")
    return _key(key) in m


def _get(m: Any, key: Any, default: Any) -> Any:
    _need(m, dict, "a map", "get")
    return m.get(_key(key), default)


def _coalesce(*values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def _split(s: Any, sep: Any) -> list[str]:
    _need(s, str, "a string", "split")
    _need(sep, str, "a string separator", "split")
    if not sep:
        raise ValueError("split() separator is empty")
    return str(s).split(str(sep))


def _join(items: Any, sep: Any) -> str:
    _need(items, list, "a list of strings", "join")
    _need(sep, str, "a string separator", "join")
    for item in items:
        _need(item, str, "a list of strings", "join")
    return str(sep).join(items)


def _numbers(items: Any, fn: str) -> list[int | float]:
    _need(items, list, "a list of numbers", fn)
    for item in items:
        _need(item, (int, float), "a list of numbers", fn)
    return list(items)


def _max(items: Any) -> int | float:
    numbers = _numbers(items, "max")
    if not numbers:
        raise ValueError("max() of an empty list")
    return max(numbers)


def _min(items: Any) -> int | float:
    numbers = _numbers(items, "min")
    if not numbers:
        raise ValueError("min() of an empty list")
    return min(numbers)


def _sum(items: Any) -> int | float:
    numbers = _numbers(items, "sum")
    # Only ints sum to an int; one double makes the sum a double, as in CEL.
    if all(isinstance(n, int) for n in numbers):
        total = sum(numbers)
        # int64 stays int64 (as CEL's `+`); only uint64-sized inputs may go past it.
        limit = INT64_MAX if all(n <= INT64_MAX for n in numbers) else UINT64_MAX
        if not INT64_MIN <= total <= limit:
            raise OverflowError("sum() overflows a 64-bit integer")
        return total
    return float(sum(numbers))


_OFFSET = re.compile(r"([+-])(\d{2}):(\d{2})\Z")


def _zone(name: str) -> datetime.tzinfo:
    offset = _OFFSET.match(name)
    if offset:
        sign = -1 if offset.group(1) == "-" else 1
        minutes = int(offset.group(2)) * 60 + int(offset.group(3))
        if minutes >= 24 * 60:
            raise ValueError(f"local_time(): offset {name!r} is out of range")
        return datetime.timezone(sign * datetime.timedelta(minutes=minutes))
    try:
        return zoneinfo.ZoneInfo(name)
    # A name the database holds as a directory ('America') raises an OSError
    # naming a file of the installation: it is an unknown zone all the same.
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        raise ValueError(f"local_time(): unknown time zone {name!r}") from exc


def _local_time(timestamp: Any, zone: Any) -> dict[str, Any]:
    _need(timestamp, str, "a timestamp", "local_time")
    _need(zone, str, "a time zone name or a +HH:MM offset", "local_time")
    text = str(timestamp)
    try:
        moment = datetime.datetime.fromisoformat(text[:10] + "T" + text[11:].upper())
    except ValueError as exc:
        raise ValueError(f"local_time(): {text!r} is not an RFC 3339 timestamp") from exc
    if moment.tzinfo is None:
        raise ValueError(f"local_time(): {text!r} has no time zone")
    local = moment.astimezone(_zone(str(zone)))
    offset = local.utcoffset() or datetime.timedelta()
    sign = "-" if offset < datetime.timedelta() else "+"
    minutes = abs(int(offset.total_seconds())) // 60
    return {
        "year": local.year,
        "month": local.month,
        "day": local.day,
        "hour": local.hour,
        "minute": local.minute,
        "second": local.second,
        # 0 = Sunday, as CEL's getDayOfWeek().
        "weekday": local.isoweekday() % 7,
        "date": local.date().isoformat(),
        "time": f"{local.hour:02d}:{local.minute:02d}",
        "offset": f"{sign}{minutes // 60:02d}:{minutes % 60:02d}",
    }


BUILTIN_FUNCTIONS: tuple[CustomFunction, ...] = (
    CustomFunction(name="lower", impl=_lower, doc="lower(s): s in lower case (Unicode)"),
    CustomFunction(name="upper", impl=_upper, doc="upper(s): s in upper case (Unicode)"),
    CustomFunction(name="trim", impl=_trim, doc="trim(s): s without leading/trailing space"),
    CustomFunction(
        name="has_key", impl=_has_key, doc="has_key(m, k): the map m has the key k (any key)"
    ),
    CustomFunction(
        name="get", impl=_get, doc="get(m, k, d): m[k] if the map m has the key k, else d"
    ),
    CustomFunction(
        name="coalesce", impl=_coalesce, doc="coalesce(a, b, ...): the first argument not null"
    ),
    CustomFunction(name="split", impl=_split, doc="split(s, sep): s split on sep"),
    CustomFunction(name="join", impl=_join, doc="join(list, sep): strings joined by sep"),
    CustomFunction(name="max", impl=_max, doc="max(list): the largest number of a list"),
    CustomFunction(name="min", impl=_min, doc="min(list): the smallest number of a list"),
    CustomFunction(
        name="sum", impl=_sum, doc="sum(list): sum of numbers (int if all are ints, else double)"
    ),
    CustomFunction(
        name="local_time",
        impl=_local_time,
        doc=(
            "local_time(ts, zone): the wall clock of timestamp ts in an IANA zone or +HH:MM"
            " offset, as a map: year, month (1-12), day, hour, minute, second,"
            " weekday (0 = Sunday), date (YYYY-MM-DD), time (HH:MM), offset"
        ),
    ),
)


def builtin_registry() -> FunctionRegistry:
    """A fresh registry holding only Ductor's built-in functions."""
    return FunctionRegistry({f.name: f for f in BUILTIN_FUNCTIONS})


_default_registry = builtin_registry()


def default_registry() -> FunctionRegistry:
    """The process-wide registry that engines built without one use.

    Register application functions here before the first engine is built.
    """
    return _default_registry


def unknown_functions(called: frozenset[str] | set[str], registry: FunctionRegistry) -> list[str]:
    """The names in `called` that are neither standard, a macro, nor registered."""
    return sorted(
        name
        for name in called
        if name not in STANDARD_FUNCTIONS and name not in MACROS and name not in registry
    )
