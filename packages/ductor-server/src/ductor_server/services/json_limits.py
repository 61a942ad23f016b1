"""The limits every JSON value from outside must keep before it reaches a store: a
nesting depth, 64-bit integers, no NUL character.

REST bodies (`transports.rest.bodies`), MCP tool arguments and the arguments a
model gives the chat agent's tools are all held to these, so a value one way
refuses is refused the other ways too. Pure functions; no transport here.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ductor_server.errors import RequestInvalid
from ductor_server.json_depth import MAX_DEPTH, nesting_depth

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of every integer in a request body (what the stores and CEL can hold)."""

# 19 digits or more may not fit in 64 bits; a NUL escape may not be stored.
# Digits to 1 and every other byte to 0, so a run of 19 digits (an integer that
# may not fit in 64 bits) is found by bytes.find at C speed; a regex took ~15 ms
# on a digit-dense 1 MiB body, on the event loop.
_DIGIT_MAP = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_LONG_DIGIT_RUN = b"1" * 19


def unstorable(value: Any) -> tuple[str, str] | None:
    """The path of the first integer outside 64 bits or string holding NUL in `value`
    (a decoded body), and why; None if there is none. Iterative: no recursion."""
    stack: list[tuple[Any, str]] = [(value, "$")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                return path, "integer does not fit in 64 bits"
        elif isinstance(item, str):
            if "\x00" in item:
                return path, "string contains a NUL character"
        elif isinstance(item, dict):
            for key, inner in item.items():
                if isinstance(key, str) and "\x00" in key:
                    return path, "key contains a NUL character"
                stack.append((inner, f"{path}.{key}"))
        elif isinstance(item, list | tuple):
            stack.extend((inner, f"{path}[{i}]") for i, inner in enumerate(item))
        elif isinstance(item, msgspec.Struct):
            names = zip(item.__struct_fields__, item.__struct_encode_fields__, strict=True)
            stack.extend((getattr(item, name), f"{path}.{wire}") for name, wire in names)
    return None


def may_be_unstorable(raw: bytes) -> bool:
    """Whether `raw` (JSON text) can hold a NUL escape or an integer past 64 bits: when
    False, `unstorable` of its decoded value is None and need not run."""
    return raw.find(b"\\u0000") >= 0 or raw.translate(_DIGIT_MAP).find(_LONG_DIGIT_RUN) >= 0


def too_deep_message() -> str:
    """Why a value nested deeper than `MAX_DEPTH` is refused."""
    return f"nested more than {MAX_DEPTH} levels deep"


_PATH_AT = re.compile(r" - at `([^`]*)`$")
_NAMED_FIELD = re.compile(r"^Object (?:missing required|contains unknown) field `([^`]*)`$")


def validation_path(exc: msgspec.ValidationError) -> tuple[str, str]:
    """(path, reason) of a msgspec validation error: the JSON path of the value at
    fault (`$` for the whole body) and what is wrong with it. A missing or unknown
    field's path is that of the field (msgspec names the object around it)."""
    text = str(exc)
    match = _PATH_AT.search(text)
    path = match.group(1) if match else "$"
    reason = text[: match.start()] if match else text
    named = _NAMED_FIELD.match(reason)
    if named is not None:
        path = f"{path}.{named.group(1)}"
    return path, reason


def check_json_limits(raw: bytes, value: Any) -> None:
    """Refuse `value` (decoded from `raw`) when it nests deeper than `MAX_DEPTH`, or
    holds an integer outside 64 bits or a NUL character (which no store can keep).

    Raises:
        RequestInvalid: `request.invalid` with `details.path` and `details.reason`.
    """
    if nesting_depth(raw) > MAX_DEPTH:
        reason = too_deep_message()
        raise RequestInvalid(
            f"invalid request body at $: {reason}", details={"path": "$", "reason": reason}
        )
    if not may_be_unstorable(raw):
        return
    found = unstorable(value)
    if found is not None:
        path, reason = found
        raise RequestInvalid(
            f"invalid request body at {path}: {reason}", details={"path": path, "reason": reason}
        )


__all__ = [
    "INT64_MAX",
    "INT64_MIN",
    "MAX_DEPTH",
    "check_json_limits",
    "may_be_unstorable",
    "nesting_depth",
    "too_deep_message",
    "unstorable",
    "validation_path",
]
