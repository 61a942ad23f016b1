"""Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) and hashes over it.

Pure encoding; no I/O. Signed payloads and content hashes use this form, so
any verifier that re-canonicalizes the same value gets the same bytes.

RFC 8785 in short: no whitespace; object keys sorted by their UTF-16 code
units; strings as UTF-8 with only the mandatory escapes (``\\"``, ``\\\\``, and
control characters, which use ``\\b \\f \\n \\r \\t`` or ``\\u00XX``);
numbers in the shortest ECMAScript form (``1.0`` is ``1``, ``1e21`` is
``1e+21``, ``-0`` is ``0``). Integers beyond ±(2**53 - 1), NaN, infinities and
lone surrogates cannot be canonicalized and raise ``receipt.not_canonical``;
amounts stay inside that range by construction (`MAX_MICROS`). To check a
document, parse it with `parse_json` (which reads large integers as doubles,
as RFC 8785 does) or ask `is_canonical`; to hash one whatever integers a
tenant put in it, `document_hash`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import msgspec
import rfc8785

from ductor_settlement.errors import NotCanonical

__all__ = ["canonical_hash", "canonical_json", "document_hash", "is_canonical", "parse_json"]


def canonical_json(value: object) -> bytes:
    """The RFC 8785 encoding of `value` (JSON values, msgspec Structs, datetimes, enums).

    Structs become objects of their fields, datetimes RFC 3339 strings and
    enums their values (`msgspec.to_builtins`) before canonicalization.

    Raises:
        NotCanonical: a value RFC 8785 cannot encode (a float NaN, an integer
            beyond 2**53 - 1, a lone surrogate, a non-string key).
    """
    try:
        builtins: Any = msgspec.to_builtins(value)
        return rfc8785.dumps(builtins)
    except (rfc8785.CanonicalizationError, TypeError) as exc:
        raise NotCanonical(
            f"value cannot be put in canonical JSON: {exc}", details={"reason": str(exc)}
        ) from exc


def canonical_hash(value: object) -> str:
    """SHA-256 over `canonical_json(value)`, as ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


_SAFE_INTEGER = 2**53 - 1


def _number(text: str) -> int | float:
    value = int(text)
    # RFC 8785 numbers are IEEE doubles: an integer past 2**53 - 1 is read as one.
    return value if abs(value) <= _SAFE_INTEGER else float(text)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes | str) -> Any:
    """Parse JSON reading numbers as RFC 8785 does (integers past 2**53 - 1 as doubles).

    Raises:
        ValueError: `data` is not JSON (NaN and Infinity literals included).
    """
    return json.loads(data, parse_int=_number, parse_constant=_no_constants)


def document_hash(value: object) -> str:
    """`canonical_hash` of `value` as a JSON reader sees it once it is written out.

    The same hash as `canonical_hash` wherever that one answers; an integer past
    2**53 - 1 (a 64-bit id among a tenant's attributes) is read as a double, as
    RFC 8785 and `parse_json` read it from the JSON text, instead of raising. So
    anyone holding the document as JSON recomputes the hash with any RFC 8785
    library. For what a tenant wrote (a routing configuration, an explanation),
    never for a signed payload, whose integers must stay exact.
    """
    return canonical_hash(parse_json(msgspec.json.encode(value)))


def is_canonical(data: bytes) -> bool:
    """True when `data` is a JSON document already in RFC 8785 form."""
    try:
        return rfc8785.dumps(parse_json(data)) == data
    except (ValueError, RecursionError):  # CanonicalizationError is a ValueError
        return False
