"""The SDK held to the golden protocol vectors in tests/contract/vectors/.

The vectors are hand-reviewed data shared with the server's tests (and any
future SDK); nothing regenerates them. If the implementation disagrees with a
vector, this test fails: fix the code, or change the vector on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor import protocol
from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    BridgeRequest,
    Opcode,
    OpcodeName,
    StepKeys,
    decode_request,
    encode,
    signature_header,
    step_id,
    verify_signature,
)


def _vectors_dir() -> Path:
    for parent in Path(__file__).resolve().parents:
        candidate = parent / "tests" / "contract" / "vectors"
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("tests/contract/vectors not found above " + str(Path(__file__)))


VECTORS = _vectors_dir()


def load(name: str) -> Any:
    return json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))


TYPES: dict[str, Any] = {"BridgeRequest": BridgeRequest, "Opcode": Opcode}


def wire_type(name: str) -> Any:
    return TYPES.get(name) or getattr(protocol, name)


ENVELOPES = [
    pytest.param(group, v, id=f"{group}:{v['name']}")
    for group in ("requests", "opcodes", "responses", "server")
    for v in load(group)["vectors"]
]


@pytest.mark.parametrize(("group", "vector"), ENVELOPES)
def test_envelope_round_trips_byte_for_byte(group: str, vector: dict[str, Any]) -> None:
    wire = vector["wire"].encode("utf-8")
    value = msgspec.json.decode(wire, type=wire_type(vector["type"]))
    assert type(value).__name__ == vector["class"]
    assert encode(value) == wire


def test_every_opcode_and_action_has_a_vector() -> None:
    opcodes = {json.loads(v["wire"])["op"] for v in load("opcodes")["vectors"]}
    assert opcodes == {op.value for op in OpcodeName}
    actions = {json.loads(v["wire"])["action"] for v in load("requests")["vectors"]}
    assert actions == {"health", "describe", "sync", "execute", "cancel"}


def test_requests_decode_through_the_bridge_decoder() -> None:
    for vector in load("requests")["vectors"]:
        assert type(decode_request(vector["wire"].encode())).__name__ == vector["class"]


@pytest.mark.parametrize("vector", load("invalid")["vectors"], ids=lambda v: v["name"])
def test_invalid_bodies_are_rejected(vector: dict[str, Any]) -> None:
    wire = vector["wire"].encode("utf-8")
    if vector["type"] == "BridgeRequest":
        with pytest.raises(ProtocolError) as info:
            decode_request(wire)
        assert info.value.code == "protocol.invalid"
    else:
        with pytest.raises(msgspec.DecodeError):
            msgspec.json.decode(wire, type=wire_type(vector["type"]))


@pytest.mark.parametrize("vector", load("signatures")["sign"], ids=lambda v: v["name"])
def test_signing_gives_the_vector_header(vector: dict[str, Any]) -> None:
    body = vector["body"].encode("utf-8")
    assert signature_header(body, vector["keys"], vector["timestamp"]) == vector["header"]


@pytest.mark.parametrize("vector", load("signatures")["verify"], ids=lambda v: v["name"])
def test_verification_accepts_or_rejects_as_the_vector_says(vector: dict[str, Any]) -> None:
    body = vector["body"].encode("utf-8")

    def check() -> int:
        return verify_signature(
            body,
            vector["header"],
            key=vector["key"],
            fallback_key=vector["fallback_key"],
            now=vector["now"],
            window=load("signatures")["window_seconds"],
        )

    if vector["expect"] == "ok":
        assert check() == int(vector["header"].split(",")[0].removeprefix("t="))
    else:
        with pytest.raises(SignatureError) as info:
            check()
        assert info.value.code == vector["expect"]


def test_window_matches_the_protocol_constant() -> None:
    assert load("signatures")["window_seconds"] == protocol.REPLAY_WINDOW_SECONDS


@pytest.mark.parametrize("sequence", load("step_ids")["sequences"])
def test_step_ids_and_repeat_numbering(sequence: dict[str, Any]) -> None:
    keys = StepKeys()
    got_keys = [keys.key(name) for name in sequence["names"]]
    assert got_keys == sequence["keys"]
    assert [step_id(k) for k in got_keys] == sequence["ids"]
