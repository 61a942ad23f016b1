"""The frames between the server and its expression sandbox processes.

A frame is a 4-byte big-endian length and a msgpack body. Variables and results
are JSON values plus what CEL adds (tz-aware datetimes natively, timedeltas as
extension 1, bytes natively). No I/O policy here: callers own the pipes.
"""

from __future__ import annotations

import struct
from datetime import timedelta
from typing import Any

import msgspec

HEADER = struct.Struct(">I")
# A frame larger than this is refused: variables come from tenants.
MAX_FRAME = 64 * 1024 * 1024
_TIMEDELTA = 1


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """Evaluate `source` against `activation` (a mapping of JSON variables)."""

    source: str
    activation: dict[str, Any]


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """An `ExpressionError` raised in the sandbox, to raise again in the server."""

    code: str
    message: str
    retryable: bool = False
    details: Any = None


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """The result of one request: `value`, or `failure` when it raised."""

    value: Any = None
    failure: Failure | None = None


def _enc_hook(value: Any) -> Any:
    # msgspec's enc_hook convention: NotImplementedError means "no encoding for this
    # type"; `frame`'s callers turn it into a clear expression error, never a crash.
    raise NotImplementedError(f"no sandbox form for {type(value).__name__}")


def _timedelta(value: timedelta) -> msgspec.msgpack.Ext:
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    return msgspec.msgpack.Ext(_TIMEDELTA, str(micros).encode())


def pack(value: Any) -> Any:
    """`value` with every timedelta made an extension: msgspec would write it as an
    ISO 8601 string, which comes back as a string."""
    if isinstance(value, dict):
        return {key: pack(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [pack(item) for item in value]
    if isinstance(value, timedelta):
        return _timedelta(value)
    return value


def _ext_hook(code: int, data: memoryview) -> Any:
    if code == _TIMEDELTA:
        return timedelta(microseconds=int(bytes(data)))
    raise msgspec.ValidationError(f"unknown extension {code}")


_encoder = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_request_decoder = msgspec.msgpack.Decoder(Request, ext_hook=_ext_hook)
_reply_decoder = msgspec.msgpack.Decoder(Reply, ext_hook=_ext_hook)


def frame(message: Request | Reply) -> bytes:
    """`message` as one frame (raises TypeError or NotImplementedError on a value
    with no sandbox form)."""
    if isinstance(message, Request):
        message = Request(source=message.source, activation=pack(message.activation))
    elif message.failure is None:
        message = Reply(value=pack(message.value))
    body = _encoder.encode(message)
    return HEADER.pack(len(body)) + body


def decode_request(body: bytes) -> Request:
    """A request frame's body."""
    return _request_decoder.decode(body)


def decode_reply(body: bytes) -> Reply:
    """A reply frame's body."""
    return _reply_decoder.decode(body)
