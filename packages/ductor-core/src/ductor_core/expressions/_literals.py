"""CEL string, bytes and double literals, read the way the CEL spec reads them.

Imports no CEL library. cel-python decodes its literals here: celpy keeps an
unknown escape as it is (`'\\q'`), drops the backslash of none of `\\?`, `\\``
and `\\X41`, and takes a surrogate (`'\\ud800'`), a `\\u` in bytes or a double
out of range (`1e999`); cel-rust and cel-go refuse those as syntax errors.

Escapes, as the spec's lexer has them:

    \\a \\b \\f \\n \\r \\t \\v \\\\ \\' \\" \\` \\?   the character
    \\xHH \\XHH                             a code point (a byte in bytes)
    \\ooo (first digit 0-3)                 a code point (a byte in bytes)
    \\uHHHH \\UHHHHHHHH                      a code point, not a surrogate;
                                          strings only
A raw literal (`r'...'`) has no escapes; a bytes literal's other characters
are their UTF-8 bytes.
"""

from __future__ import annotations

import math
import re

from ductor_core.expressions._syntax import LimitExceeded, Unreadable, tokenize

_ESCAPE = re.compile(
    r"\\(?:(?P<simple>[abfnrtv\\'\"`?])|[xX](?P<hex>[0-9a-fA-F]{2})"
    r"|(?P<octal>[0-3][0-7]{2})|u(?P<u4>[0-9a-fA-F]{4})|U(?P<u8>[0-9a-fA-F]{8})|(?P<bad>.?))",
    re.DOTALL,
)
_SIMPLE = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}


class LiteralError(ValueError):
    """A literal the spec does not allow; the message says why."""


def _split(text: str) -> tuple[str, str]:
    # (prefix, body between the quotes)
    prefix = text[: len(text) - len(text.lstrip("rRbB"))]
    quoted = text[len(prefix) :]
    quote = 3 if quoted[:3] in ("'''", '"""') else 1
    return prefix.lower(), quoted[quote:-quote]


def _code_point(match: re.Match[str], is_bytes: bool) -> int:
    simple, hex_digits, octal = match.group("simple", "hex", "octal")
    if simple is not None:
        return _SIMPLE.get(simple, ord(simple))
    if hex_digits is not None:
        return int(hex_digits, 16)
    if octal is not None:
        return int(octal, 8)
    unicode = match.group("u4") or match.group("u8")
    if unicode is not None:
        if is_bytes:
            raise LiteralError(f"{match.group()[:2]} escapes are not allowed in bytes")
        value = int(unicode, 16)
        if 0xD800 <= value <= 0xDFFF or value > 0x10FFFF:
            raise LiteralError(f"{match.group()} is not a Unicode code point")
        return value
    raise LiteralError(f"invalid escape {match.group()!r}")


def decode_string(text: str) -> str | bytes:
    """The value of a CEL string or bytes literal token (quotes and prefix included).

    Raises:
        LiteralError: an escape the spec does not allow.
    """
    prefix, body = _split(text)
    is_bytes = "b" in prefix
    if "r" in prefix:
        return body.encode("utf-8") if is_bytes else body
    if is_bytes:
        chunks: list[bytes] = []
        position = 0
        for match in _ESCAPE.finditer(body):
            chunks.append(body[position : match.start()].encode("utf-8"))
            chunks.append(bytes((_code_point(match, True),)))
            position = match.end()
        chunks.append(body[position:].encode("utf-8"))
        return b"".join(chunks)
    pieces: list[str] = []
    position = 0
    for match in _ESCAPE.finditer(body):
        pieces.append(body[position : match.start()])
        pieces.append(chr(_code_point(match, False)))
        position = match.end()
    pieces.append(body[position:])
    return "".join(pieces)


def decode_double(text: str) -> float:
    """The value of a CEL double literal token.

    Raises:
        LiteralError: a literal too large for a double (`1e999`).
    """
    value = float(text)
    if not math.isfinite(value):
        raise LiteralError(f"invalid double literal {text}: out of range")
    return value


def string_literal(source: str) -> str | None:
    """The value of `source` when it is a single CEL string literal (blanks and
    comments aside), so a check can judge it before any run; else None (an
    expression, a bytes literal, or a literal the spec refuses).
    """
    try:
        tokens = tokenize(source, max_tokens=1, max_nesting=0)
        if len(tokens) != 1 or tokens[0].kind != "string":
            return None
        value = decode_string(tokens[0].text)
    except (LimitExceeded, Unreadable, LiteralError):
        return None
    return value if isinstance(value, str) else None
