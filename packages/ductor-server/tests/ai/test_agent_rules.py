"""The chat agent's pure rules: the tools it offers (the MCP table, keys left to the
agent), the transcript it sends (each answer followed by its calls' results), the
checks of its bodies (each refusal with a pointer) and the cut of a long result."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from ductor_server.ai import ConversationRecord, MessageRecord, ToolCallRecord
from ductor_server.errors import RequestInvalid
from ductor_server.services.agent import (
    MAX_DECISIONS,
    MAX_MESSAGE_CHARS,
    MODEL_TOOLS,
    SYSTEM_PROMPT,
    ConversationBody,
    MessageBody,
    _capped,
    check_conversation_body,
    check_message_body,
    transcript,
)
from ductor_server.services.tools import TOOLS, input_schema

NOW = datetime(2026, 1, 1, tzinfo=UTC)
CALL = "atc_" + "a" * 32


def test_the_model_is_offered_the_mcp_tools_without_their_keys() -> None:
    assert [t["function"]["name"] for t in MODEL_TOOLS] == [tool.name for tool in TOOLS]
    for offered, tool in zip(MODEL_TOOLS, TOOLS, strict=True):
        parameters = offered["function"]["parameters"]
        expected = input_schema(tool)
        expected["properties"].pop("idempotency_key", None)
        assert parameters["properties"] == expected["properties"]
        assert "idempotency_key" not in parameters.get("required", [])
        assert offered["function"]["description"] == tool.description


def test_the_transcript_puts_each_result_after_its_answer() -> None:
    conversation = ConversationRecord(
        tenant_id="t",
        id="agc_1",
        title="t",
        model="m",
        instructions="Be brief.",
        created_at=NOW,
        updated_at=NOW,
    )
    messages = [
        MessageRecord(seq=0, turn=1, role="user", content="why?", created_at=NOW),
        MessageRecord(seq=1, turn=1, role="assistant", content=None, created_at=NOW),
        MessageRecord(seq=2, turn=2, role="user", content="and?", created_at=NOW),
    ]
    call = ToolCallRecord(
        id=CALL,
        conversation_id="agc_1",
        message_seq=1,
        position=0,
        turn=1,
        tool="get_run",
        arguments='{"run_id": "r"}',
        mutates=False,
        status="executed",
        result='{"id": "r"}',
        created_at=NOW,
    )
    sent = transcript(conversation, messages, [call])
    assert sent[0] == {"role": "system", "content": SYSTEM_PROMPT + "\n\nBe brief."}
    assert [m["role"] for m in sent[1:]] == ["user", "assistant", "tool", "user"]
    assert sent[2]["tool_calls"] == [
        {
            "id": CALL,
            "type": "function",
            "function": {"name": "get_run", "arguments": '{"run_id": "r"}'},
        }
    ]
    assert sent[3] == {"role": "tool", "tool_call_id": CALL, "content": '{"id": "r"}'}


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        (MessageBody(), "/content"),
        (MessageBody(content=" "), "/content"),
        (MessageBody(content="x" * (MAX_MESSAGE_CHARS + 1)), "/content"),
        (MessageBody(confirm=["nope"]), "/confirm/0"),
        (MessageBody(confirm=[CALL, CALL]), "/confirm/1"),
        (MessageBody(confirm=[CALL], reject=[CALL]), "/reject/0"),
        (MessageBody(reject=[CALL] * (MAX_DECISIONS + 1)), "/reject"),
    ],
)
def test_a_bad_message_names_where(body: MessageBody, pointer: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        check_message_body(body)
    assert refused.value.details == {"pointer": pointer}


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        (ConversationBody(model=" "), "/model"),
        (ConversationBody(model="m\n"), "/model"),
        (ConversationBody(model="m", connection=""), "/connection"),
        (ConversationBody(model="m", title="t" * 201), "/title"),
        (ConversationBody(model="m", instructions="i" * 8001), "/instructions"),
        (ConversationBody(model="m", message=""), "/message"),
    ],
)
def test_a_bad_conversation_names_where(body: ConversationBody, pointer: str) -> None:
    with pytest.raises(RequestInvalid) as refused:
        check_conversation_body(body)
    assert refused.value.details == {"pointer": pointer}


def test_a_long_result_is_cut_with_a_marker() -> None:
    assert _capped("abc", 3) == ("abc", False)
    assert _capped("abcdef", 3) == ("abc…[truncated: 3 more characters]", True)
