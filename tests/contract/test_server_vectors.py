"""The server's side of the bridge held to the golden vectors in tests/contract/vectors/.

What the server stores and sends goes through its own paths here: execute
requests are rebuilt from the task payload the bridge tick queues, app answers
are decoded as the driver does and applied by the bridge tick, server bodies
are decoded and re-encoded, and signatures are verified as the API does.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ductor import protocol
from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    BridgeRequest,
    ExecuteResponse,
    Opcode,
    SigningKeys,
    decode,
    decode_request,
    encode,
    step_record,
)
from ductor_core.runs import AttemptResult, DispatchTask, RunStatus
from ductor_server.bridge.keys import BridgeKeys
from ductor_server.bridge.tick import BridgeTickResult, bridge_start, bridge_tick

VECTORS = Path(__file__).resolve().parent / "vectors"
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def load(name: str) -> Any:
    return json.loads((VECTORS / f"{name}.json").read_text(encoding="utf-8"))


def _type(name: str) -> Any:
    return {"BridgeRequest": BridgeRequest, "Opcode": Opcode}.get(name) or getattr(protocol, name)


def _vectors(group: str) -> list[Any]:
    return [pytest.param(v, id=v["name"]) for v in load(group)["vectors"]]


@pytest.mark.parametrize("vector", _vectors("requests"))
def test_execute_requests_survive_the_task_payload_byte_for_byte(vector: dict[str, Any]) -> None:
    request = decode_request(vector["wire"].encode())
    assert type(request).__name__ == vector["class"]
    # The bridge tick stores the request as JSON in the task; the driver rebuilds it.
    stored = json.loads(json.dumps(msgspec.to_builtins(request)))
    rebuilt = msgspec.convert(stored, type(request))
    assert encode(rebuilt) == vector["wire"].encode()


@pytest.mark.parametrize("vector", _vectors("server"))
def test_server_bodies_decode_and_encode_byte_for_byte(vector: dict[str, Any]) -> None:
    value = decode(vector["wire"].encode(), _type(vector["type"]))
    assert type(value).__name__ == vector["class"]
    assert encode(value) == vector["wire"].encode()


def _start() -> tuple[BridgeTickResult, DispatchTask]:
    first = bridge_start(run_id="run-1", app_id="shop", workflow_id="wf", input=None, now=T0)
    [task] = [c for c in first.commands if isinstance(c, DispatchTask)]
    return first, task


@pytest.mark.parametrize("vector", _vectors("opcodes"))
def test_every_opcode_is_applied_by_the_bridge_tick(vector: dict[str, Any]) -> None:
    op: Any = msgspec.json.decode(vector["wire"].encode(), type=Opcode)
    first, task = _start()
    answer = AttemptResult(
        step_ref=task.step_ref,
        attempt=task.attempt,
        ok=True,
        output={"opcodes": msgspec.to_builtins([op])},
    )
    result = bridge_tick(first.state, first.data, [answer], T0)
    assert result.ignored == []
    error = result.state.error
    assert error is None or error.code != "bridge.bad_response"
    data = result.data
    if vector["class"] in ("StepRunOp", "StepFailedOp"):
        assert data.history == [step_record(op)]
    elif vector["class"] == "RunCompleteOp":
        assert result.state.status == RunStatus.SUCCEEDED
    elif vector["class"] == "RunFailedOp":
        assert result.state.status == RunStatus.FAILED
    elif vector["class"] in ("StepErrorOp", "RunErrorOp"):
        assert data.attempt == 1
        assert data.main_retry
    else:
        assert list(data.pending) == [op.id]


@pytest.mark.parametrize("vector", _vectors("responses"))
def test_app_answers_decode_as_the_driver_decodes_them(vector: dict[str, Any]) -> None:
    value = decode(vector["wire"].encode(), _type(vector["type"]))
    if isinstance(value, ExecuteResponse):
        stored = json.loads(json.dumps({"opcodes": msgspec.to_builtins(value.opcodes)}))
        assert msgspec.convert(stored["opcodes"], list[Opcode]) == value.opcodes
    assert encode(value) == vector["wire"].encode()


@pytest.mark.parametrize("vector", _vectors("invalid"))
def test_invalid_bodies_are_refused(vector: dict[str, Any]) -> None:
    wire = vector["wire"].encode()
    if vector["type"] == "BridgeRequest":
        with pytest.raises(ProtocolError):
            decode_request(wire)
    elif vector["type"] == "Opcode":
        # An app answering an opcode that does not decode fails the run, clearly.
        first, task = _start()
        answer = AttemptResult(
            step_ref=task.step_ref,
            attempt=task.attempt,
            ok=True,
            output={"opcodes": [json.loads(wire)]},
        )
        result = bridge_tick(first.state, first.data, [answer], T0)
        assert result.state.status == RunStatus.FAILED
        assert result.state.error is not None
        assert result.state.error.code == "bridge.bad_response"
    else:
        with pytest.raises(ProtocolError):
            decode(wire, _type(vector["type"]))


@pytest.mark.parametrize("case", load("signatures")["verify"], ids=lambda c: c["name"])
def test_signatures_verify_as_the_server_verifies_them(case: dict[str, Any]) -> None:
    keys = SigningKeys(case["key"], case.get("fallback_key"))
    body = case["body"].encode()
    if case["expect"] == "ok":
        keys.verify(body, case["header"], now=case["now"])
        return
    with pytest.raises(SignatureError) as raised:
        keys.verify(body, case["header"], now=case["now"])
    assert raised.value.code == case["expect"]


# The server signs with its primary key only: the single-key vectors apply.
@pytest.mark.parametrize(
    "case",
    [c for c in load("signatures")["sign"] if len(c["keys"]) == 1],
    ids=lambda c: c["name"],
)
def test_the_server_signs_as_the_vectors_say(case: dict[str, Any]) -> None:
    keys = SigningKeys(case["keys"][0])
    assert keys.header(case["body"].encode(), now=case["timestamp"]) == case["header"]


# Requests with a nonce: the server signs its calls to an app with each of the
# app's active keys (a v1 and a v2 per key) and verifies with `BridgeKeys`.
@pytest.mark.parametrize("case", load("signatures")["sign_nonce"], ids=lambda c: c["name"])
def test_the_server_signs_requests_with_a_nonce_as_the_vectors_say(case: dict[str, Any]) -> None:
    keys = BridgeKeys(
        sign_with=case["keys"], verify_with=case["keys"], app_id="a", require_nonce=True
    )
    header = keys.header(case["body"].encode(), now=case["timestamp"], nonce=case["nonce"])
    assert header == case["header"]


@pytest.mark.parametrize("case", load("signatures")["verify_nonce"], ids=lambda c: c["name"])
def test_nonce_signatures_verify_as_the_server_verifies_them(case: dict[str, Any]) -> None:
    keys = BridgeKeys(
        sign_with=case["keys"][:1],
        verify_with=case["keys"],
        app_id=None,
        require_nonce=case["require_nonce"],
    )
    body = case["body"].encode()
    if case["expect"] == "ok":
        assert keys.check(body, case["header"], now=case["now"]).nonce == case["nonce"]
        return
    with pytest.raises(SignatureError) as raised:
        keys.check(body, case["header"], now=case["now"])
    assert raised.value.code == case["expect"]
