"""Checking a connection's `config`, `secrets` and a step's `input` against a provider's
msgspec Structs, reporting every problem with a JSON pointer; the masks the API shows
instead of secrets; and the redaction that keeps secrets out of messages and outputs.

Pure functions over plain values: no store, no keys, no network.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

S = TypeVar("S", bound=msgspec.Struct)

MASK = "••••"
"""What a secret, or any place one was found in a message or an output, shows as."""

_PATH_AT = re.compile(r" - at `([^`]*)`$")
_PATH_PART = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\.\.\.\]")
_SHOWN_TAIL = 4
_TAIL_FROM = 16  # only a secret at least this long shows its last characters


def pointer(*parts: str | int) -> str:
    """The RFC 6901 JSON pointer made of `parts`."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _msgspec_pointer(base: str, path: str) -> str:
    parts = [m.group(1) or m.group(2) or "" for m in _PATH_PART.finditer(path.removeprefix("$"))]
    return base + pointer(*[p for p in parts if p])


def struct_fields(tp: type[msgspec.Struct]) -> tuple[frozenset[str], frozenset[str]]:
    """Every field's wire name, and the required ones, of struct `tp`."""
    info = msgspec.inspect.type_info(tp)
    assert isinstance(info, msgspec.inspect.StructType)
    return (
        frozenset(f.encode_name for f in info.fields),
        frozenset(f.encode_name for f in info.fields if f.required),
    )


def problems_of(value: Any, tp: type[msgspec.Struct], at: str) -> list[dict[str, str]]:
    """Every problem of `value` as `tp` (`{"pointer", "message"}`, pointers under `at`):
    each unknown field, each missing one and each wrongly typed value; when no field
    is missing or wrongly typed, also what the struct's own checks refuse."""
    if not isinstance(value, Mapping):
        return [{"pointer": at, "message": f"'{at}' must be an object"}]
    known, required = struct_fields(tp)
    unknown = [
        {"pointer": at + pointer(key), "message": f"unknown field {key!r}"}
        for key in value
        if key not in known
    ]
    missing = [
        {"pointer": at + pointer(name), "message": f"missing required field {name!r}"}
        for name in sorted(required)
        if name not in value
    ]
    # Converting the struct stops at its first wrongly typed field: each is converted alone.
    typed = [
        _conversion_problem(value[f.encode_name], f.type, at + pointer(f.encode_name))
        for f in msgspec.structs.fields(tp)
        if f.encode_name in value
    ]
    wrong = [p for p in typed if p is not None]
    if missing or wrong:
        return unknown + missing + wrong
    whole = _conversion_problem({k: v for k, v in value.items() if k in known}, tp, at)
    return unknown + ([whole] if whole is not None else [])


def _conversion_problem(value: Any, tp: Any, at: str) -> dict[str, str] | None:
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH_AT.search(text)
        where = _msgspec_pointer(at, match.group(1)) if match else at
        reason = text[: match.start()] if match else text
        return {"pointer": where, "message": reason}
    return None


def decode(value: Any, tp: type[S]) -> S:
    """`value` as `tp` (after `problems_of` found nothing).

    Raises:
        msgspec.ValidationError: it does not fit.
    """
    return msgspec.convert(value, tp)


def mask_of(secrets: Mapping[str, Any]) -> dict[str, str]:
    """What the API shows of each secret field that is set: `••••` and, for a string
    of 16 characters or more, its last 4."""
    masks: dict[str, str] = {}
    for name, value in secrets.items():
        if value is None:
            continue
        tail = value[-_SHOWN_TAIL:] if isinstance(value, str) and len(value) >= _TAIL_FROM else ""
        masks[name] = MASK + tail
    return masks


def secret_strings(value: Any) -> list[str]:
    """The strings in a secrets object (every one but the empty string), longest first."""
    found: set[str] = set()
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if item:
                found.add(item)
        elif isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, msgspec.Struct):
            stack.extend(getattr(item, f) for f in item.__struct_fields__)
    return sorted(found, key=len, reverse=True)


__all__ = [
    "MASK",
    "decode",
    "mask_of",
    "pointer",
    "problems_of",
    "secret_strings",
    "struct_fields",
]
