"""Signing properties, the protocol module's dependency boundary, and durations."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ductor.protocol
from ductor.durations import canonical_duration, format_duration, parse_duration
from ductor.errors import DurationError, ProtocolError, SignatureError
from ductor.protocol import (
    SeenNonces,
    SigningKeys,
    parse_signature_header,
    sign,
    verify_signature,
    verify_signed,
)

KEYS = st.text(min_size=1, max_size=40)
TIMESTAMPS = st.integers(min_value=0, max_value=2**40)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=512), key=KEYS, t=TIMESTAMPS, skew=st.integers(-300, 300))
def test_signed_messages_verify_within_the_window(body: bytes, key: str, t: int, skew: int) -> None:
    header = SigningKeys(key).header(body, now=t)
    assert SigningKeys(key).verify(body, header, now=t + skew) == t


@settings(max_examples=200, deadline=None)
@given(body=st.binary(min_size=1, max_size=256), key=KEYS, t=TIMESTAMPS, data=st.data())
def test_any_changed_byte_is_a_mismatch(body: bytes, key: str, t: int, data: st.DataObject) -> None:
    header = SigningKeys(key).header(body, now=t)
    index = data.draw(st.integers(0, len(body) - 1))
    flipped = body[:index] + bytes([body[index] ^ 0x01]) + body[index + 1 :]
    with pytest.raises(SignatureError) as info:
        verify_signature(flipped, header, key=key, now=t)
    assert info.value.code == "signature.mismatch"


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=64), primary=KEYS, old=KEYS, t=TIMESTAMPS)
def test_fallback_verifies_old_signatures_and_nothing_else(
    body: bytes, primary: str, old: str, t: int
) -> None:
    header = SigningKeys(old).header(body, now=t)
    assert SigningKeys(primary, old).verify(body, header, now=t) == t
    if primary != old:
        with pytest.raises(SignatureError):
            SigningKeys(primary).verify(body, header, now=t)


@settings(max_examples=100, deadline=None)
@given(t=TIMESTAMPS, late=st.integers(301, 10**6), early=st.booleans())
def test_outside_the_window_is_expired(t: int, late: int, early: bool) -> None:
    header = SigningKeys("k").header(b"{}", now=t)
    with pytest.raises(SignatureError) as info:
        SigningKeys("k").verify(b"{}", header, now=t - late if early else t + late)
    assert info.value.code == "signature.expired"


def test_header_parts() -> None:
    ab, cd = "AB" * 32, "cd" * 32
    assert parse_signature_header(f"t=5,v1={ab},v0=x,v1={cd}") == (5, [ab.lower(), cd])
    assert sign(b"", "k", 0) == sign(b"", "k", 0)
    with pytest.raises(SignatureError, match="must not be empty"):
        SigningKeys("")


HEX = "ab" * 32


@pytest.mark.parametrize(
    "header",
    [
        f"t=\u00b2,v1={HEX}",  # a digit to str.isdigit(), not to int()
        f"t=\u0661,v1={HEX}",  # Arabic-Indic one
        f"t={'9' * 4400},v1={HEX}",  # past int()'s digit limit
        f"t={'9' * 16},v1={HEX}",
        f"t=,v1={HEX}",
        f"t=-5,v1={HEX}",
        f"t=5,t=6,v1={HEX}",
        "t=5,v1=\u00e9" + "a" * 63,  # compare_digest refuses non-ASCII text
        "t=5,v1=abc",
        "t=5,v1=" + "g" * 64,
        "t=5",
        f"v1={HEX}",
        "t=5,garbage",
        f"t=5,v1={HEX}," + "v0=x," * 300,
    ],
)
def test_malformed_headers_are_a_signature_error_never_a_crash(header: str) -> None:
    with pytest.raises(SignatureError) as info:
        verify_signature(b"{}", header, key="k", now=5)
    assert info.value.code == "signature.malformed"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_header_text_verifies_or_raises_a_signature_error(header: str) -> None:
    with pytest.raises(SignatureError):
        verify_signature(b"{}", header, key="k", now=5)


def test_protocol_module_depends_on_msgspec_hashlib_and_hmac_only() -> None:
    source = Path(ductor.protocol.__file__).read_text(encoding="utf-8")
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    allowed = {
        "__future__",
        "collections.abc",
        "enum",
        "functools",
        "hashlib",
        "heapq",  # SeenNonces: expiry order
        "hmac",
        "msgspec",
        "secrets",  # new_nonce: the one read of the OS random source
        "typing",
        "ductor.errors",  # itself stdlib-only
    }
    assert imported <= allowed, imported - allowed
    errors_source = Path(ductor.errors.__file__).read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(errors_source)):
        if isinstance(node, ast.ImportFrom):
            assert node.module in {"__future__", "datetime", "typing"}


@pytest.mark.parametrize(
    ("text", "seconds", "canonical"),
    [
        ("250ms", 0.25, "250ms"),
        ("2s", 2, "2s"),
        ("90s", 90, "1m30s"),
        ("1h30m", 5400, "1h30m"),
        ("7d", 604800, "7d"),
        ("0s", 0, "0s"),
        ("1.5h", 5400, "1h30m"),
    ],
)
def test_durations(text: str, seconds: float, canonical: str) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)
    assert canonical_duration(text) == canonical
    assert canonical_duration(timedelta(seconds=seconds)) == canonical


@pytest.mark.parametrize(
    "text", ["", "10", "5 m", "-1s", "1y", "s", "99999999999999999999d", "36501d", "1" * 400 + "s"]
)
def test_bad_durations(text: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration(text)
    assert info.value.code == "duration.invalid"


def test_negative_timedelta_is_refused() -> None:
    with pytest.raises(DurationError):
        format_duration(timedelta(seconds=-1))


def test_a_timedelta_past_the_longest_duration_is_refused() -> None:
    assert canonical_duration(timedelta(days=36_500)) == "36500d"
    with pytest.raises(DurationError, match="36500d"):
        canonical_duration(timedelta(days=36_501))


def test_decode_of_a_union_type_reports_a_protocol_error() -> None:
    from ductor.protocol import Opcode, decode

    with pytest.raises(ProtocolError) as info:
        decode(b'{"op": "NOT_AN_OPCODE"}', Opcode)  # type: ignore[arg-type]
    assert "invalid" in str(info.value)


_EXECUTE = b'{"action":"execute","run_id":"r","workflow_id":"w","input":'
_UNREADABLE_BODIES = {
    "invalid UTF-8": _EXECUTE + b'"\xff"}',
    "invalid UTF-8 in a key": _EXECUTE + b'{"\xff":1}}',
    "nested too deep": _EXECUTE + b"[" * 100_000 + b"]" * 100_000 + b"}",
}


@pytest.mark.parametrize("body", _UNREADABLE_BODIES.values(), ids=list(_UNREADABLE_BODIES))
def test_a_body_that_is_not_json_text_is_a_protocol_error(body: bytes) -> None:
    from ductor.protocol import ExecuteRequest, decode, decode_request

    with pytest.raises(ProtocolError):
        decode_request(body)
    with pytest.raises(ProtocolError):
        decode(body, ExecuteRequest)


@pytest.mark.parametrize("body", _UNREADABLE_BODIES.values(), ids=list(_UNREADABLE_BODIES))
async def test_the_bridge_answers_400_for_a_body_that_is_not_json_text(body: bytes) -> None:
    import time

    import msgspec

    from ductor import Client
    from ductor.protocol import SIGNATURE_HEADER, ErrorResponse

    client = Client("app", signing_key="k")

    @client.workflow("w")
    async def w(ctx: object, value: object) -> object:
        return value

    header = SigningKeys("k").request_header(body, now=int(time.time()))
    answer = await client.handle("POST", {SIGNATURE_HEADER: header}, body)
    assert answer.status == 400, answer.body
    assert msgspec.json.decode(answer.body, type=ErrorResponse).code == "protocol.invalid"


def test_seen_nonces_refuse_a_second_use_until_the_window_has_passed() -> None:
    seen = SeenNonces(capacity=2, window=300)
    seen.first_use("n" * 16, timestamp=1000, now=1000)
    with pytest.raises(SignatureError) as replayed:
        seen.first_use("n" * 16, timestamp=1000, now=1300)  # still verifiable: refused
    assert replayed.value.code == "signature.replayed"
    seen.first_use("m" * 16, timestamp=1000, now=1000)
    with pytest.raises(SignatureError) as full:
        seen.first_use("o" * 16, timestamp=1000, now=1000)
    assert (full.value.code, full.value.retryable) == ("signature.replay_cache_full", True)
    # once t + window has passed the old nonces are forgotten (their signatures expired)
    seen.first_use("o" * 16, timestamp=1301, now=1301)
    assert len(seen) == 1


NONCES = st.text(
    alphabet="0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_-",
    min_size=16,
    max_size=64,
)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=256), key=KEYS, t=TIMESTAMPS, nonce=NONCES, other=NONCES)
def test_a_request_verifies_with_its_own_nonce_only(
    body: bytes, key: str, t: int, nonce: str, other: str
) -> None:
    header = SigningKeys(key).header(body, now=t, nonce=nonce)
    verified = verify_signed(body, header, keys=[key], now=t, require_nonce=True)
    assert verified.nonce == nonce
    if other != nonce:
        swapped = header.replace(f"n={nonce},", f"n={other},")
        with pytest.raises(SignatureError) as info:
            verify_signed(body, swapped, keys=[key], now=t, require_nonce=True)
        assert info.value.code == "signature.mismatch"
