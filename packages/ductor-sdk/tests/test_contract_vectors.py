"""The SDK held to the golden protocol vectors in tests/contract/vectors/.

The vectors are hand-reviewed data shared with the server's tests (and any
future SDK); nothing regenerates them. If the implementation disagrees with a
vector, this test fails: fix the code, or change the vector on purpose.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor import Client, Context, NonRetriableError, StepFailed, protocol
from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    SIGNATURE_HEADER,
    BridgeRequest,
    ErrorResponse,
    ExecuteRequest,
    Opcode,
    OpcodeName,
    SigningKeys,
    StepKeys,
    StepRecord,
    Verified,
    decode,
    decode_request,
    encode,
    signature_header,
    step_id,
    verify_signature,
    verify_signed,
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
    elif vector["type"] == "Opcode":
        with pytest.raises(msgspec.DecodeError):
            msgspec.json.decode(wire, type=Opcode)
    else:
        with pytest.raises(ProtocolError) as info:
            decode(wire, wire_type(vector["type"]))
        assert info.value.code == "protocol.invalid"


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


@pytest.mark.parametrize("vector", load("signatures")["sign_nonce"], ids=lambda v: v["name"])
def test_signing_with_a_nonce_gives_the_vector_header(vector: dict[str, Any]) -> None:
    body = vector["body"].encode("utf-8")
    header = signature_header(body, vector["keys"], vector["timestamp"], nonce=vector["nonce"])
    assert header == vector["header"]
    if len(vector["keys"]) == 1:
        keys = SigningKeys(vector["keys"][0])
        assert keys.header(body, now=vector["timestamp"], nonce=vector["nonce"]) == header


@pytest.mark.parametrize("vector", load("signatures")["verify_nonce"], ids=lambda v: v["name"])
def test_nonce_verification_accepts_or_rejects_as_the_vector_says(vector: dict[str, Any]) -> None:
    body = vector["body"].encode("utf-8")

    def check() -> Verified:
        return verify_signed(
            body,
            vector["header"],
            keys=vector["keys"],
            now=vector["now"],
            window=load("signatures")["window_seconds"],
            require_nonce=vector["require_nonce"],
        )

    if vector["expect"] == "ok":
        verified = check()
        assert verified.nonce == vector["nonce"]
        assert verified.timestamp == int(vector["header"].split(",")[0].removeprefix("t="))
    else:
        with pytest.raises(SignatureError) as info:
            check()
        assert info.value.code == vector["expect"]


def test_a_receiver_accepts_each_nonce_once_as_the_vector_says() -> None:
    replay = load("signatures")["replay"]
    clock = {"now": 0.0}
    client = Client("contract", signing_key=replay["key"], clock=lambda: clock["now"])
    for step in replay["steps"]:
        clock["now"] = float(step["now"])
        body = step["body"].encode("utf-8")
        answer = asyncio.run(client.handle("POST", {SIGNATURE_HEADER: step["header"]}, body))
        if step["expect"] == "ok":
            assert answer.status == 200, answer.body
        else:
            assert answer.status == 401
            assert decode(answer.body, ErrorResponse).code == step["expect"]


def test_window_matches_the_protocol_constant() -> None:
    assert load("signatures")["window_seconds"] == protocol.REPLAY_WINDOW_SECONDS


@pytest.mark.parametrize("sequence", load("step_ids")["sequences"])
def test_step_ids_and_repeat_numbering(sequence: dict[str, Any]) -> None:
    keys = StepKeys()
    got_keys = [keys.key(name) for name in sequence["names"]]
    assert got_keys == sequence["keys"]
    assert [step_id(k) for k in got_keys] == sequence["ids"]


# ---------------------------------------------------------------- replay scenarios


def scenario_client(program: list[Any]) -> Client:
    """The workflow 'scenario' built from a replay vector's program (see replay.json)."""
    client = Client("contract", signing_key="contract-key")

    def returning(value: Any) -> Any:
        return lambda: value

    def raising(code: str) -> Any:
        def boom() -> None:
            raise NonRetriableError("declined", code=code)

        return boom

    @client.workflow("scenario", retries=2)
    async def scenario(ctx: Context, _: Any) -> list[Any]:
        out: list[Any] = []
        for op in program:
            kind = op[0]
            if kind == "run":
                out.append(await ctx.step.run(op[1], returning(op[2])))
            elif kind == "sleep":
                out.append(await ctx.step.sleep(op[1], op[2]))
            elif kind == "event":
                got = await ctx.step.wait_for_event(op[1], event=op[2], timeout=op[3])
                out.append(None if got is None else got.data)
            elif kind == "signal":
                sig = await ctx.step.wait_for_signal(op[1], timeout=op[2])
                out.append(None if sig is None else sig.data)
            elif kind == "invoke":
                out.append(await ctx.step.invoke(op[1], workflow=op[2], input=op[3]))
            elif kind == "fail":
                try:
                    await ctx.step.run(op[1], raising(op[2]))
                except StepFailed as failed:
                    out.append(f"failed:{failed.code}")
            elif kind == "gather":
                runs = [ctx.step.run(name, returning(value)) for name, value in op[1]]
                out.append(list(await asyncio.gather(*runs)))
            else:
                raise AssertionError(f"unknown program op {kind!r}")
        return out

    return client


def comparable(value: Any) -> Any:
    """Drop the SDK's own words (error message and exception name) before comparing."""
    if isinstance(value, dict):
        return {
            k: comparable(v)
            for k, v in value.items()
            if not ("code" in value and "retryable" in value and k in ("message", "name"))
        }
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


@pytest.mark.parametrize("scenario", load("replay")["scenarios"], ids=lambda s: s["name"])
def test_replay_scenario(scenario: dict[str, Any]) -> None:
    client = scenario_client(scenario["program"])
    request = ExecuteRequest(
        run_id="run-1",
        workflow_id="scenario",
        attempt=scenario.get("attempt", 0),
        steps=msgspec.convert(scenario["history"], list[StepRecord]),
        target_step=scenario.get("target_step"),
    )
    response = asyncio.run(client.execute(request))
    got = [json.loads(encode(op)) for op in response.opcodes]
    assert comparable(got) == comparable(scenario["expect"])
