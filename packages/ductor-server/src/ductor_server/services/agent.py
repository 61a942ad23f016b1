"""The chat agent: a conversation with a model that answers from Ductor's own data by
calling the tools of `services.tools` (the MCP server's tools) as functions.

A request (a new conversation's first message, or `post_message`) is one **turn**:

1. In one transaction: the conversation is locked, the turn is stored `running`
   with this request's Idempotency-Key, the caller's decisions on waiting tool
   calls are applied (confirmed calls become `approved`, rejected ones get a
   "not executed" result) and the user's message is stored.
2. The loop, with no transaction open across a call: run every `approved` tool
   call through its service function under the caller's tenant, storing each
   result; stop at `awaiting_confirmation` when calls wait for the caller;
   else send the transcript with the tool definitions to the tenant's `openai`
   connection through the inference proxy (`AiService.proxy`, so each model
   call is admitted by the budgets, recorded as an AI request with `source`
   `agent`, priced and metered) and store its answer, with the tool calls it
   asks for, in one transaction that also adds the call's AI request id and
   cost to the turn. A read-only tool call is `approved` at once; a mutating
   one only when the request allows mutations, else it is `pending`. An answer
   without tool calls ends the turn `completed`; the eighth model call of a
   request ends it `step_limit` (its tool calls are `skipped`).
3. A model call that fails (upstream error or timeout, a budget, no
   connection) ends the turn `failed` with the error, which the caller gets
   with `conversation_id` and `turn` in its details. What was stored stays
   consistent: every stored step is whole (an answer and all its tool calls),
   so a retry with the same Idempotency-Key resumes the turn from there.

The transcript sent to the model is the system prompt, then each stored
message in order, each answer followed by one `tool` message per tool call
(its stored result). A turn's loop holds a lease (`runner`, `lease_until`) of
the engine's task lease (`DUCTOR_LEASE_SECONDS`), renewed at every write and by a
heartbeat every third of it while a model or tool call is in flight: a request
finding a running turn whose lease passed (its process died) marks it
`interrupted`, or resumes it when it is the same request. No transport here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

import msgspec

from ductor_core.errors import DuctorError
from ductor_server.ai import (
    AgentTx,
    AiNoConnection,
    AiTx,
    AiUpstreamError,
    ConfirmationRequired,
    ConversationBusy,
    ConversationNotFound,
    ConversationRecord,
    ConversationTooLong,
    MessageRecord,
    ToolCallNotPending,
    ToolCallRecord,
    TurnRecord,
)
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.errors import IdempotencyConflict, RequestInvalid, ServerError
from ductor_server.services.ai import AiService, new_request_id, without_lone_surrogates
from ductor_server.services.cursors import parse_time_cursor, time_cursor
from ductor_server.services.idempotency import Answer, Outcome, check_key, fingerprint
from ductor_server.services.tools import (
    TOOLS,
    TOOLS_BY_NAME,
    ToolError,
    ToolSpec,
    builtins,
    decode_arguments_json,
    error_body,
    input_schema,
)
from ductor_server.storage.protocol import Store

if TYPE_CHECKING:
    from ductor_server.services import Services

log = logging.getLogger("ductor_server.agent")

MAX_MODEL_CALLS: Final = 8
"""The most model calls one request makes before its turn ends `step_limit`."""

MAX_MESSAGE_CHARS: Final = 32_000
"""The longest user message, in characters."""

MAX_ANSWER_CHARS: Final = 64_000
"""The most of a model's answer stored (and sent back to it), in characters."""

MAX_INSTRUCTIONS_CHARS: Final = 8_000
"""The longest `instructions` a conversation may add to the system prompt."""

MAX_TITLE_CHARS: Final = 200
"""The longest conversation title."""

MAX_MESSAGES: Final = 200
"""A conversation takes no new message once it holds this many (user and model)."""

MAX_TOOL_CALLS: Final = 8
"""The most tool calls of one model answer that run; the others fail unrun."""

MAX_TOOL_CALLS_KEPT: Final = 32
"""The most tool calls of one model answer stored (and shown to the model again);
an answer's calls past these are dropped."""

MAX_RESULT_CHARS: Final = 8_000
"""The most of one tool result sent to the model (and stored), in characters."""

MAX_ARGUMENT_CHARS: Final = 16_000
"""The longest arguments of one tool call the model may give, in characters."""

MAX_DECISIONS: Final = 64
"""The most tool call ids one message may confirm (and as many reject)."""

MAX_PAGE: Final = 200
"""The most conversations one page lists."""

TOOL_TIMEOUT: Final = 60.0
"""Seconds one tool call may take."""

DEFAULT_LEASE: Final = timedelta(seconds=60)
"""How long a turn's loop holds its turn without renewing it, unless told otherwise."""

WAIT_POLL: Final = (0.05, 0.5)
"""Seconds between two looks of a request waiting for the same request's turn: the
first wait, and the longest (each wait is twice the last)."""

SYSTEM_PROMPT: Final = (
    "You are Ductor's operations assistant. Ductor runs durable workflows, routes units "
    "of work (leads, tickets, tasks) to workers and buyers, and keeps a ledger. Answer "
    "from Ductor's stored data by calling the tools; never guess an id or a figure. To "
    "explain why a routable (a lead, a ticket) went to a worker, find its assignment "
    "(list_assignments with routable_id), read its decision (get_decision) and quote the "
    "decision's explanation: the rule, the pool, the candidates, the exclusions and why, "
    "the strategy's scores and pick. To retry failed runs, list them (list_runs with "
    "status RUN_STATUS_FAILED and the family) and re-run each one (rerun_run). Tools that "
    "change something may wait for the user's confirmation: when a tool result says it "
    "was not executed, tell the user so and do not claim it happened."
)

_CONVERSATION_ID = re.compile(r"agc_[0-9a-f]{32}")
_CALL_ID = re.compile(r"atc_[0-9a-f]{32}")
_MAX_TOOL_NAME = 128

RUNNING: Final = "running"
COMPLETED: Final = "completed"
AWAITING: Final = "awaiting_confirmation"
STEP_LIMIT: Final = "step_limit"
FAILED: Final = "failed"
INTERRUPTED: Final = "interrupted"


# --- bodies and views -------------------------------------------------------------------


class ConversationBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent/conversations`.

    Attributes:
        model: the model every turn asks (as the proxy's `model`).
        connection: the tenant's `openai` connection (None: its default at each call).
        title: a title (the first message's start if None).
        instructions: added to the system prompt (at most 8,000 characters).
        message: the first message; None creates the conversation only.
        allow_mutations: the first turn may run mutating tools without confirmation.
    """

    model: str
    connection: str | None = None
    title: str | None = None
    instructions: str = ""
    message: str | None = None
    allow_mutations: bool = False


class MessageBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/agent/conversations/{id}/messages`: a message, decisions, or both.

    Attributes:
        content: the user's message.
        confirm: ids of waiting tool calls to run.
        reject: ids of waiting tool calls not to run (the model is told).
        allow_mutations: this turn may run mutating tools without confirmation.
    """

    content: str | None = None
    confirm: list[str] = []
    reject: list[str] = []
    allow_mutations: bool = False


class ToolCallView(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call the model asked for (see docs/ai.md for every field)."""

    id: str
    turn: int
    tool: str
    arguments: Any
    mutates: bool
    status: str
    approval: str | None
    result: Any
    result_truncated: bool
    error_code: str | None
    created_at: datetime
    decided_at: datetime | None
    decided_turn: int | None
    executed_at: datetime | None


class MessageView(msgspec.Struct, frozen=True, kw_only=True):
    """A user's or the model's message; the model's with the tool calls it asked for."""

    seq: int
    turn: int
    role: str
    content: str | None
    ai_request_id: str | None
    tool_calls: list[ToolCallView]
    created_at: datetime


class TurnSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One request's work: how it ended, its model calls and their cost."""

    turn: int
    status: str
    error: dict[str, Any] | None
    model_calls: int
    ai_request_ids: list[str]
    cost_micros: int
    created_at: datetime
    finished_at: datetime | None


class TurnView(msgspec.Struct, frozen=True, kw_only=True):
    """A turn as its request answers it.

    Attributes:
        answer: the model's last text of the turn (None if it gave none).
        messages: the turn's messages, the model's with their tool calls.
        decided: the calls this turn's request confirmed or rejected.
        pending: every call of the conversation waiting for a decision.
    """

    turn: int
    status: str
    error: dict[str, Any] | None
    model_calls: int
    ai_request_ids: list[str]
    cost_micros: int
    answer: str | None
    messages: list[MessageView]
    decided: list[ToolCallView]
    pending: list[ToolCallView]
    created_at: datetime
    finished_at: datetime | None


class ConversationSummary(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation in a listing."""

    id: str
    title: str
    model: str
    connection: str | None
    turns: int
    messages: int
    cost_micros: int
    created_at: datetime
    updated_at: datetime


class ConversationView(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation with every message, tool call and turn.

    Attributes:
        status: `running` (a turn is), `awaiting_confirmation` (calls wait) or `idle`.
    """

    id: str
    title: str
    model: str
    connection: str | None
    instructions: str
    status: str
    turns: list[TurnSummary]
    messages: list[MessageView]
    pending: list[ToolCallView]
    cost_micros: int
    created_at: datetime
    updated_at: datetime


class AgentAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """What a POST answers: the conversation, and the turn it ran (None: no message)."""

    conversation: ConversationSummary
    turn: TurnView | None


class ConversationPage(msgspec.Struct, frozen=True, kw_only=True):
    """Conversations newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[ConversationSummary]
    next_cursor: str | None = None


# --- pure helpers -----------------------------------------------------------------------


def _clean(text: str) -> str:
    """`text` as a store keeps it (no NUL character)."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _capped(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to `limit` characters with a marker saying how much was cut."""
    if len(text) <= limit:
        return text, False
    return f"{text[:limit]}…[truncated: {len(text) - limit} more characters]", True


def _json_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


def _error_text(body: dict[str, Any]) -> str:
    return _json_text({"error": body})


def _decoded(text: str | None) -> Any:
    """A stored JSON text decoded, or the text itself when it is not JSON (cut)."""
    if text is None:
        return None
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return text


def _model_tool(tool: ToolSpec) -> dict[str, Any]:
    """`tool` as an OpenAI function; the agent gives mutating calls their own
    idempotency key, so the model is not asked for one."""
    schema = input_schema(tool)
    properties = dict(schema.get("properties") or {})
    properties.pop("idempotency_key", None)
    schema["properties"] = properties
    if "required" in schema:
        schema["required"] = [name for name in schema["required"] if name != "idempotency_key"]
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": schema},
    }


MODEL_TOOLS: Final = [_model_tool(tool) for tool in TOOLS]
"""The tools as the model is offered them: the MCP server's, as OpenAI functions."""


def _problem(pointer: str, message: str) -> RequestInvalid:
    return RequestInvalid(f"{pointer}: {message}", details={"pointer": pointer})


def _check_text(value: str | None, pointer: str, limit: int, *, blank: bool = False) -> None:
    if value is None:
        return
    if len(value) > limit:
        raise _problem(pointer, f"at most {limit} characters (got {len(value)})")
    if not blank and not value.strip():
        raise _problem(pointer, "must not be blank")


def check_conversation_body(body: ConversationBody) -> None:
    """Refuse a bad new conversation, naming the field.

    Raises:
        RequestInvalid: with `details.pointer`.
    """
    model = body.model
    if not model.strip() or len(model) > 256 or any(ord(c) < 32 for c in model):
        raise _problem("/model", "a model name is 1-256 characters without control characters")
    connection = body.connection
    if connection is not None and (not connection or len(connection) > 64):
        raise _problem("/connection", "a connection's name is 1-64 characters")
    _check_text(body.title, "/title", MAX_TITLE_CHARS)
    _check_text(body.instructions, "/instructions", MAX_INSTRUCTIONS_CHARS, blank=True)
    _check_text(body.message, "/message", MAX_MESSAGE_CHARS)


def check_message_body(body: MessageBody) -> None:
    """Refuse a bad message: blank or over-long content, too many or malformed ids,
    an id twice, or nothing at all.

    Raises:
        RequestInvalid: with `details.pointer`.
    """
    _check_text(body.content, "/content", MAX_MESSAGE_CHARS)
    seen: dict[str, str] = {}
    for name in ("confirm", "reject"):
        ids = getattr(body, name)
        if len(ids) > MAX_DECISIONS:
            raise _problem(f"/{name}", f"at most {MAX_DECISIONS} tool call ids")
        for index, call_id in enumerate(ids):
            pointer = f"/{name}/{index}"
            if not _CALL_ID.fullmatch(call_id):
                raise _problem(pointer, "not a tool call id (atc_ and 32 hex digits)")
            if call_id in seen:
                raise _problem(pointer, f"tool call {call_id!r} is already at {seen[call_id]}")
            seen[call_id] = pointer
    if body.content is None and not body.confirm and not body.reject:
        raise _problem("/content", "send a message, or confirm or reject tool calls")


def _call_view(record: ToolCallRecord) -> ToolCallView:
    return ToolCallView(
        id=record.id,
        turn=record.turn,
        tool=record.tool,
        arguments=_decoded(record.arguments),
        mutates=record.mutates,
        status=record.status,
        approval=record.approval,
        result=_decoded(record.result),
        result_truncated=record.result_truncated,
        error_code=record.error_code,
        created_at=record.created_at,
        decided_at=record.decided_at,
        decided_turn=record.decided_turn,
        executed_at=record.executed_at,
    )


def _summary(record: ConversationRecord) -> ConversationSummary:
    return ConversationSummary(
        id=record.id,
        title=record.title,
        model=record.model,
        connection=record.connection,
        turns=record.turns,
        messages=record.messages,
        cost_micros=record.cost_micros,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )


def _turn_summary(record: TurnRecord) -> TurnSummary:
    return TurnSummary(
        turn=record.turn,
        status=record.status,
        error=record.error,
        model_calls=record.model_calls,
        ai_request_ids=list(record.ai_request_ids),
        cost_micros=record.cost_micros,
        created_at=record.created_at,
        finished_at=record.finished_at,
    )


def _message_views(messages: list[MessageRecord], calls: list[ToolCallRecord]) -> list[MessageView]:
    by_message: dict[int, list[ToolCallView]] = {}
    for call in calls:
        by_message.setdefault(call.message_seq, []).append(_call_view(call))
    return [
        MessageView(
            seq=m.seq,
            turn=m.turn,
            role=m.role,
            content=m.content,
            ai_request_id=m.ai_request_id,
            tool_calls=by_message.get(m.seq, []),
            created_at=m.created_at,
        )
        for m in messages
    ]


def transcript(
    conversation: ConversationRecord, messages: list[MessageRecord], calls: list[ToolCallRecord]
) -> list[dict[str, Any]]:
    """The messages sent to the model: the system prompt, then each stored message,
    each answer followed by the results of its tool calls."""
    system = SYSTEM_PROMPT
    if conversation.instructions.strip():
        system += "\n\n" + conversation.instructions
    out: list[dict[str, Any]] = [{"role": "system", "content": system}]
    by_message: dict[int, list[ToolCallRecord]] = {}
    for call in calls:
        by_message.setdefault(call.message_seq, []).append(call)
    for message in messages:
        if message.role != "assistant":
            out.append({"role": message.role, "content": message.content or ""})
            continue
        asked = by_message.get(message.seq, [])
        entry: dict[str, Any] = {"role": "assistant", "content": message.content}
        if asked:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.tool, "arguments": call.arguments},
                }
                for call in asked
            ]
        out.append(entry)
        out.extend(
            {"role": "tool", "tool_call_id": call.id, "content": call.result or "{}"}
            for call in asked
        )
    return out


def _model_message(content: bytes | None) -> dict[str, Any]:
    """The assistant message of a chat completion.

    Raises:
        AiUpstreamError: the answer holds none.
    """
    try:
        # A lone surrogate escape is replaced: the message is stored and answered.
        answer = without_lone_surrogates(json.loads(content or b""))
    except (ValueError, RecursionError):
        answer = None
    choices = answer.get("choices") if isinstance(answer, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    if not isinstance(message, dict):
        raise AiUpstreamError(
            "the model's answer holds no message (choices[0].message)", {"upstream_status": 200}
        )
    return message


# --- the service ------------------------------------------------------------------------


class _TurnLost(Exception):
    """Another loop took the turn over (this one's lease had passed)."""


class AgentService:
    """The chat agent of every tenant.

    Args:
        store: the opened store.
        ai: the inference proxy every model call goes through.
        clock: where `now` comes from.
        lease: how long a turn's loop holds the turn past its last renewal (it renews
            it every third of this while it runs); a turn whose loop died is taken
            over once this has passed.

    `bind` gives it the process's services (the tools call them) once they are built.
    """

    def __init__(
        self,
        store: Store,
        ai: AiService,
        *,
        clock: Clock | None = None,
        lease: timedelta = DEFAULT_LEASE,
    ) -> None:
        if lease <= timedelta(0):
            raise ValueError(f"a turn's lease must be positive (got {lease})")
        self._store = store
        self._ai = ai
        self._clock = clock or SystemClock()
        self._lease = lease
        self._services: Callable[[], Services] | None = None

    def bind(self, services: Callable[[], Services]) -> None:
        """Give the tools their services (the composition root calls this once)."""
        self._services = services

    def _tools_services(self) -> Services:
        if self._services is None:
            raise RuntimeError("AgentService.bind() was not called")
        return self._services()

    # --- reading ---------------------------------------------------------------------

    async def get(self, tenant_id: str, conversation_id: str) -> ConversationView:
        """A conversation with its messages, tool calls, turns and cost.

        Raises:
            ConversationNotFound: `agent.conversation_not_found` (another tenant's too).
        """
        if not _CONVERSATION_ID.fullmatch(conversation_id):
            raise ConversationNotFound(conversation_id[:64])
        async with self._store.transaction() as tx:
            store = AgentTx(tx)
            record = await store.get_conversation(tenant_id, conversation_id)
            if record is None:
                raise ConversationNotFound(conversation_id)
            messages = await store.list_messages(tenant_id, conversation_id)
            calls = await store.list_tool_calls(tenant_id, conversation_id)
            turns = await store.list_turns(tenant_id, conversation_id)
        now = self._clock.now()
        pending = [_call_view(c) for c in calls if c.status == "pending"]
        status = "idle"
        if any(t.status == RUNNING and t.lease_until > now for t in turns):
            status = RUNNING
        elif pending:
            status = AWAITING
        return ConversationView(
            id=record.id,
            title=record.title,
            model=record.model,
            connection=record.connection,
            instructions=record.instructions,
            status=status,
            turns=[_turn_summary(t) for t in turns],
            messages=_message_views(messages, calls),
            pending=pending,
            cost_micros=record.cost_micros,
            created_at=record.created_at,
            updated_at=record.updated_at,
        )

    async def list(
        self, tenant_id: str, *, cursor: str | None = None, limit: int = 50
    ) -> ConversationPage:
        """The tenant's conversations, newest first; an empty `cursor` is the first page.

        Raises:
            RequestInvalid: a cursor this API did not give, a limit out of 1..200.
        """
        if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise RequestInvalid(
                f"limit must be from 1 to {MAX_PAGE}", details={"pointer": "limit"}
            )
        before = None
        if cursor:
            before = parse_time_cursor(cursor)
            if not _CONVERSATION_ID.fullmatch(before[1]):
                raise RequestInvalid(
                    "cursor is not one this API gave", details={"pointer": "cursor"}
                )
        async with self._store.transaction() as tx:
            records = await AgentTx(tx).list_conversations(
                tenant_id, before=before, limit=limit + 1
            )
        more = len(records) > limit
        records = records[:limit]
        return ConversationPage(
            items=[_summary(r) for r in records],
            next_cursor=time_cursor(records[-1].created_at, records[-1].id)
            if more and records
            else None,
        )

    async def _answer(self, tenant_id: str, conversation_id: str, turn: int | None) -> AgentAnswer:
        async with self._store.transaction() as tx:
            store = AgentTx(tx)
            record = await store.get_conversation(tenant_id, conversation_id)
            if record is None:  # pragma: no cover - conversations are never deleted
                raise ConversationNotFound(conversation_id)
            if turn is None:
                return AgentAnswer(conversation=_summary(record), turn=None)
            stored = await store.get_turn(tenant_id, conversation_id, turn)
            messages = await store.list_messages(tenant_id, conversation_id)
            calls = await store.list_tool_calls(tenant_id, conversation_id)
        assert stored is not None
        mine = [m for m in messages if m.turn == turn]
        answer = next(
            (m.content for m in reversed(mine) if m.role == "assistant" and m.content), None
        )
        view = TurnView(
            turn=stored.turn,
            status=stored.status,
            error=stored.error,
            model_calls=stored.model_calls,
            ai_request_ids=list(stored.ai_request_ids),
            cost_micros=stored.cost_micros,
            answer=answer,
            messages=_message_views(mine, calls),
            decided=[_call_view(c) for c in calls if c.decided_turn == turn],
            pending=[_call_view(c) for c in calls if c.status == "pending"],
            created_at=stored.created_at,
            finished_at=stored.finished_at,
        )
        return AgentAnswer(conversation=_summary(record), turn=view)

    # --- writing ---------------------------------------------------------------------

    async def create(
        self, tenant_id: str, body: ConversationBody, *, idempotency_key: str | None = None
    ) -> Answer[AgentAnswer]:
        """Start a conversation, and run its first turn when it has a message; `CREATED`.

        Raises:
            RequestInvalid: a bad field (`details.pointer`).
            AiNoConnection, ConnectionNotFound, AiConnectionUnsupported: no upstream
                (nothing is written).
            IdempotencyConflict: the key made another conversation.
            AiUpstreamError, AiUpstreamTimeout, BudgetExceeded: the first turn failed
                (the conversation and the turn are stored; `details` name them).
        """
        check_conversation_body(body)
        key = check_key(idempotency_key)
        request_hash = fingerprint("agent.conversations.create", body)
        try:
            await self._ai.check_connection(tenant_id, body.connection)
        except AiNoConnection:
            raise AiNoConnection(
                pointer="/connection", where="the conversation's connection"
            ) from None
        now = self._clock.now()
        message = _clean(body.message) if body.message is not None else None
        title = body.title if body.title is not None else (message or "conversation")[:80]
        conversation = ConversationRecord(
            tenant_id=tenant_id,
            id=f"agc_{uuid.uuid4().hex}",
            title=_clean(title.strip() or "conversation"),
            model=body.model,
            connection=body.connection,
            instructions=_clean(body.instructions),
            create_key=key,
            create_hash=request_hash if key is not None else None,
            turns=1 if message is not None else 0,
            messages=1 if message is not None else 0,
            created_at=now,
            updated_at=now,
        )
        turn = self._new_turn(
            conversation.id, 1, key, request_hash, body.allow_mutations, now + self._lease
        )
        existing: ConversationRecord | None = None
        async with self._store.transaction() as tx:
            store = AgentTx(tx)
            if key is not None:
                await tx.session.advisory_lock(f"agent.create:{tenant_id}:{key}")
                existing = await store.find_conversation_by_key(tenant_id, key)
            if existing is None:
                await store.insert_conversation(conversation)
                if message is not None:
                    await store.insert_turn(tenant_id, turn)
                    await store.insert_message(
                        tenant_id,
                        conversation.id,
                        MessageRecord(seq=0, turn=1, role="user", content=message, created_at=now),
                    )
        if existing is not None:
            if existing.create_hash != request_hash:
                raise IdempotencyConflict(
                    "this Idempotency-Key was already used with a different request",
                    details={"key": key, "scope": "agent.conversations.create"},
                )
            assert key is not None
            async with self._store.transaction() as tx:
                keyed = await AgentTx(tx).find_turn_by_key(tenant_id, existing.id, key)
            if keyed is None:
                answer = await self._answer(tenant_id, existing.id, None)
                return Answer(answer, Outcome.CREATED, replayed=True)
            return await self._keyed(tenant_id, existing, keyed, request_hash)
        if message is None:
            return Answer(await self._answer(tenant_id, conversation.id, None), Outcome.CREATED)
        await self._drive(tenant_id, conversation, turn)
        return Answer(await self._answer(tenant_id, conversation.id, 1), Outcome.CREATED)

    async def post_message(
        self,
        tenant_id: str,
        conversation_id: str,
        body: MessageBody,
        *,
        idempotency_key: str | None = None,
    ) -> Answer[AgentAnswer]:
        """Send a message and decide waiting tool calls, then run the turn; `CREATED`.

        Raises:
            ConversationNotFound: `agent.conversation_not_found`.
            RequestInvalid: a bad body (`details.pointer`).
            ConversationBusy: another request's turn still runs.
            ConfirmationRequired: tool calls wait and this request does not decide all.
            ToolCallNotPending: an id names no waiting call of this conversation.
            ConversationTooLong: the conversation is full.
            IdempotencyConflict: the key was used with another request.
            AiUpstreamError, AiUpstreamTimeout, BudgetExceeded, ...: the turn failed
                (it is stored, `failed`; `details` name the conversation and turn).
        """
        if not _CONVERSATION_ID.fullmatch(conversation_id):
            raise ConversationNotFound(conversation_id[:64])
        check_message_body(body)
        key = check_key(idempotency_key)
        request_hash = fingerprint(f"agent.messages:{conversation_id}", body)
        now = self._clock.now()
        keyed: TurnRecord | None = None
        async with self._store.transaction() as tx:
            store = AgentTx(tx)
            await store.lock(tenant_id, conversation_id)
            conversation = await store.get_conversation(tenant_id, conversation_id)
            if conversation is None:
                raise ConversationNotFound(conversation_id)
            if key is not None:
                keyed = await store.find_turn_by_key(tenant_id, conversation_id, key)
            if keyed is None:
                turn = await self._open_turn(store, conversation, body, key, request_hash, now)
        if keyed is not None:
            return await self._keyed(tenant_id, conversation, keyed, request_hash)
        await self._drive(tenant_id, conversation, turn)
        return Answer(await self._answer(tenant_id, conversation_id, turn.turn), Outcome.CREATED)

    def _new_turn(
        self,
        conversation_id: str,
        number: int,
        key: str | None,
        request_hash: str,
        allow: bool,
        lease_until: datetime,
    ) -> TurnRecord:
        now = self._clock.now()
        return TurnRecord(
            conversation_id=conversation_id,
            turn=number,
            idempotency_key=key,
            request_hash=request_hash,
            allow_mutations=allow,
            runner=uuid.uuid4().hex,
            status=RUNNING,
            lease_until=lease_until,
            created_at=now,
        )

    async def _open_turn(
        self,
        store: AgentTx,
        conversation: ConversationRecord,
        body: MessageBody,
        key: str | None,
        request_hash: str,
        now: datetime,
    ) -> TurnRecord:
        """Store a new turn with its decisions and message (in the caller's transaction,
        which holds the conversation's lock)."""
        tenant_id, conversation_id = conversation.tenant_id, conversation.id
        for running in await store.running_turns(tenant_id, conversation_id):
            if running.lease_until > now:
                raise ConversationBusy(conversation_id, running.turn)
            # Its process died: the loop left it. This turn goes on from what it stored.
            left = msgspec.structs.replace(running, status=INTERRUPTED, finished_at=now)
            await store.update_turn(tenant_id, left, runner=None)
        calls = {c.id: c for c in await store.list_tool_calls(tenant_id, conversation_id)}
        for name in ("confirm", "reject"):
            for index, call_id in enumerate(getattr(body, name)):
                found = calls.get(call_id)
                if found is None or found.status != "pending":
                    raise ToolCallNotPending(
                        call_id, f"/{name}/{index}", None if found is None else found.status
                    )
        decided = set(body.confirm) | set(body.reject)
        waiting = [c.id for c in calls.values() if c.status == "pending" and c.id not in decided]
        if waiting:
            raise ConfirmationRequired(waiting)
        if body.content is not None and conversation.messages >= MAX_MESSAGES:
            raise ConversationTooLong(conversation_id, MAX_MESSAGES)
        number = conversation.turns + 1
        turn = self._new_turn(
            conversation_id, number, key, request_hash, body.allow_mutations, now + self._lease
        )
        await store.insert_turn(tenant_id, turn)
        for call_id in body.confirm:
            await store.update_tool_call(
                tenant_id,
                conversation_id,
                call_id,
                status="approved",
                expect="pending",
                approval="confirmed",
                decided_at=now,
                decided_turn=number,
            )
        for call_id in body.reject:
            refusal = {
                "code": "agent.rejected",
                "message": "not executed: the user rejected this call",
                "details": None,
            }
            await store.update_tool_call(
                tenant_id,
                conversation_id,
                call_id,
                status="rejected",
                expect="pending",
                approval="rejected",
                result=_error_text(refusal),
                error_code="agent.rejected",
                decided_at=now,
                decided_turn=number,
            )
        if body.content is not None:
            await store.insert_message(
                tenant_id,
                conversation_id,
                MessageRecord(
                    seq=conversation.messages,
                    turn=number,
                    role="user",
                    content=_clean(body.content),
                    created_at=now,
                ),
            )
        await store.add_to_conversation(
            tenant_id,
            conversation_id,
            now=now,
            turns=1,
            messages=1 if body.content is not None else 0,
        )
        return turn

    async def _keyed(
        self,
        tenant_id: str,
        conversation: ConversationRecord,
        turn: TurnRecord,
        request_hash: str,
    ) -> Answer[AgentAnswer]:
        """The answer to a request whose Idempotency-Key already has a turn: wait for it
        while it runs, resume it when it failed (or its loop died), else replay it."""
        if turn.request_hash != request_hash:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request",
                details={"key": turn.idempotency_key, "turn": turn.turn},
            )
        conversation_id = conversation.id
        pause = WAIT_POLL[0]
        while True:
            now = self._clock.now()
            if turn.status == FAILED or (turn.status == RUNNING and turn.lease_until <= now):
                resumed = await self._resume(tenant_id, conversation_id, turn, now)
                if resumed is not None:
                    await self._drive(tenant_id, conversation, resumed)
                    answer = await self._answer(tenant_id, conversation_id, turn.turn)
                    return Answer(answer, Outcome.CREATED)
            elif turn.status != RUNNING:
                answer = await self._answer(tenant_id, conversation_id, turn.turn)
                return Answer(answer, Outcome.CREATED, replayed=True)
            await asyncio.sleep(pause)
            pause = min(pause * 2, WAIT_POLL[1])
            async with self._store.transaction() as tx:
                found = await AgentTx(tx).get_turn(tenant_id, conversation_id, turn.turn)
            assert found is not None
            if found.status == FAILED and turn.status == RUNNING:
                # The request this one repeats failed while this one waited: its error
                # is this one's answer too (a later retry resumes the turn).
                raise _stored_error(found)
            turn = found

    async def _resume(
        self, tenant_id: str, conversation_id: str, turn: TurnRecord, now: datetime
    ) -> TurnRecord | None:
        """Take a failed (or abandoned) turn back to `running` for this loop; None when
        it changed meanwhile.

        Raises:
            ServerError: the turn's own error, when later turns followed it (it is
                not resumed behind them).
            ConversationBusy: another turn runs.
        """
        async with self._store.transaction() as tx:
            store = AgentTx(tx)
            await store.lock(tenant_id, conversation_id)
            found = await store.get_turn(tenant_id, conversation_id, turn.turn)
            if found is None or (found.status, found.runner) != (turn.status, turn.runner):
                return None
            conversation = await store.get_conversation(tenant_id, conversation_id)
            latest = conversation.turns if conversation is not None else found.turn
            if found.status == FAILED and latest != found.turn:
                raise _stored_error(found)
            for running in await store.running_turns(tenant_id, conversation_id):
                if running.turn != turn.turn and running.lease_until > now:
                    raise ConversationBusy(conversation_id, running.turn)
            resumed = msgspec.structs.replace(
                found,
                status=RUNNING,
                runner=uuid.uuid4().hex,
                error=None,
                finished_at=None,
                lease_until=now + self._lease,
            )
            await store.update_turn(tenant_id, resumed, runner=None)
        return resumed

    # --- the loop --------------------------------------------------------------------

    async def _drive(
        self, tenant_id: str, conversation: ConversationRecord, turn: TurnRecord
    ) -> TurnRecord:
        """Run the turn's loop until it waits, ends or fails (see the module docstring).

        Raises:
            the model call's error (the turn is stored `failed` first).
        """
        loop = _Loop(
            store=self._store,
            ai=self._ai,
            clock=self._clock,
            services=self._tools_services,
            tenant_id=tenant_id,
            conversation=conversation,
            turn=turn,
            lease=self._lease,
        )
        try:
            return await loop.run()
        except _TurnLost:
            raise ConversationBusy(conversation.id, turn.turn) from None
        except DuctorError:
            raise
        except Exception as exc:
            log.exception("turn %s of conversation %s failed", turn.turn, conversation.id)
            error = ServerError("internal server error", code="internal")
            await loop.fail(None, error)
            raise error from exc


class _Loop:
    """One request's run of a turn's loop (it holds the turn's `runner`)."""

    def __init__(
        self,
        *,
        store: Store,
        ai: AiService,
        clock: Clock,
        services: Callable[[], Services],
        tenant_id: str,
        conversation: ConversationRecord,
        turn: TurnRecord,
        lease: timedelta,
    ) -> None:
        self.store = store
        self.ai = ai
        self.clock = clock
        self.services = services
        self.tenant_id = tenant_id
        self.conversation = conversation
        self.turn = turn
        self.lease = lease

    async def run(self) -> TurnRecord:
        """Run tool calls and model calls until the turn waits or ends, renewing the
        turn's lease meanwhile (a model call may take the tenant's whole timeout)."""
        keeper = asyncio.create_task(self._keep_lease())
        try:
            return await self._run()
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    async def _keep_lease(self) -> None:
        """Every third of the lease, move it on; stop when the turn is no longer this
        loop's. A failed renewal is tried again at the next beat."""
        interval = max(self.lease.total_seconds() / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                async with self.store.transaction() as tx:
                    held = await AgentTx(tx).extend_turn(
                        self.tenant_id,
                        self.conversation.id,
                        self.turn.turn,
                        runner=self.turn.runner,
                        lease_until=self._lease_until(self.clock.now()),
                    )
            except Exception:
                log.exception(
                    "renewing the lease of turn %s of %s failed",
                    self.turn.turn,
                    self.conversation.id,
                )
                continue
            if not held:
                return

    async def _run(self) -> TurnRecord:
        calls = 0
        while True:
            await self._run_approved()
            async with self.store.transaction() as tx:
                store = AgentTx(tx)
                messages = await store.list_messages(self.tenant_id, self.conversation.id)
                asked = await store.list_tool_calls(self.tenant_id, self.conversation.id)
            if any(call.status == "pending" for call in asked):
                return await self._end(AWAITING)
            body = {
                "model": self.conversation.model,
                "messages": transcript(self.conversation, messages, asked),
                "tools": MODEL_TOOLS,
            }
            request_id = new_request_id()
            try:
                answer = await self.ai.proxy(
                    self.tenant_id,
                    "chat",
                    body,
                    connection=self.conversation.connection,
                    source="agent",
                    request_id=request_id,
                )
                message = _model_message(answer.content)
            except DuctorError as error:
                raise await self.fail(request_id, error) from None
            calls += 1
            # The last call's answer ends the turn: `completed`, or `step_limit`.
            self.turn = await self._step(request_id, message, last=calls >= MAX_MODEL_CALLS)
            if self.turn.status != RUNNING:
                return self.turn

    def _lease_until(self, now: datetime) -> datetime:
        return now + self.lease

    async def _write_turn(self, store: AgentTx, record: TurnRecord) -> None:
        if not await store.update_turn(self.tenant_id, record, runner=self.turn.runner):
            raise _TurnLost()
        self.turn = record

    async def _end(self, status: str, error: dict[str, Any] | None = None) -> TurnRecord:
        now = self.clock.now()
        async with self.store.transaction() as tx:
            record = msgspec.structs.replace(
                self.turn, status=status, error=error, finished_at=now, lease_until=now
            )
            await self._write_turn(AgentTx(tx), record)
        return self.turn

    async def fail(self, request_id: str | None, error: DuctorError) -> DuctorError:
        """Store the turn `failed` with `error` (and the failed call's record and cost);
        the error to answer, naming the conversation and turn."""
        now = self.clock.now()
        placed = _placed(error, self.conversation.id, self.turn.turn)
        try:
            async with self.store.transaction() as tx:
                store = AgentTx(tx)
                record = None
                if request_id is not None:
                    record = await AiTx(tx).get_request(self.tenant_id, request_id)
                cost = 0 if record is None else record.cost_micros
                ids = list(self.turn.ai_request_ids)
                if record is not None:
                    ids.append(request_id)  # type: ignore[arg-type]
                failed = msgspec.structs.replace(
                    self.turn,
                    status=FAILED,
                    error=error_body(placed),
                    model_calls=self.turn.model_calls + (record is not None),
                    ai_request_ids=ids,
                    cost_micros=self.turn.cost_micros + cost,
                    finished_at=now,
                    lease_until=now,
                )
                await self._write_turn(store, failed)
                await store.add_to_conversation(
                    self.tenant_id, self.conversation.id, now=now, cost_micros=cost
                )
        except _TurnLost:
            pass
        return placed

    async def _step(self, request_id: str, message: dict[str, Any], *, last: bool) -> TurnRecord:
        """Store one model answer with its tool calls, and the call's record and cost."""
        now = self.clock.now()
        content = message.get("content")
        text = _capped(_clean(content), MAX_ANSWER_CHARS)[0] if isinstance(content, str) else None
        raw_calls = message.get("tool_calls")
        raw_calls = raw_calls[:MAX_TOOL_CALLS_KEPT] if isinstance(raw_calls, list) else []
        async with self.store.transaction() as tx:
            store = AgentTx(tx)
            conversation = await store.get_conversation(self.tenant_id, self.conversation.id)
            assert conversation is not None
            seq = conversation.messages
            asked = [
                self._asked(raw, seq, position, now, last=last)
                for position, raw in enumerate(raw_calls)
            ]
            record = await AiTx(tx).get_request(self.tenant_id, request_id)
            cost = 0 if record is None else record.cost_micros
            status, error = RUNNING, None
            if not asked:
                status = COMPLETED
            elif last:
                status, error = STEP_LIMIT, _step_limit()
            done = status != RUNNING
            updated = msgspec.structs.replace(
                self.turn,
                status=status,
                error=error,
                model_calls=self.turn.model_calls + 1,
                ai_request_ids=[*self.turn.ai_request_ids, request_id],
                cost_micros=self.turn.cost_micros + cost,
                lease_until=now if done else self._lease_until(now),
                finished_at=now if done else None,
            )
            await self._write_turn(store, updated)
            await store.insert_message(
                self.tenant_id,
                self.conversation.id,
                MessageRecord(
                    seq=seq,
                    turn=self.turn.turn,
                    role="assistant",
                    content=text,
                    ai_request_id=request_id,
                    created_at=now,
                ),
            )
            await store.insert_tool_calls(self.tenant_id, asked)
            await store.add_to_conversation(
                self.tenant_id, self.conversation.id, now=now, messages=1, cost_micros=cost
            )
        return self.turn

    def _asked(
        self, raw: Any, seq: int, position: int, now: datetime, *, last: bool
    ) -> ToolCallRecord:
        """Classify one tool call of an answer: refused (`failed`) when it cannot run,
        `skipped` at the step limit, else `approved` or `pending`."""
        function = raw.get("function") if isinstance(raw, dict) else None
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        name = _clean(name)[:_MAX_TOOL_NAME] if isinstance(name, str) and name else "unknown"
        arguments = function.get("arguments")
        if isinstance(arguments, dict):  # some servers send the object itself
            arguments = _json_text(arguments)
        spec = TOOLS_BY_NAME.get(name)
        refusal: dict[str, Any] | None = None
        if not isinstance(arguments, str):
            arguments = "{}"
            refusal = {"code": "request.invalid", "message": "the arguments are not JSON text"}
        elif len(arguments) > MAX_ARGUMENT_CHARS:
            arguments = "{}"
            refusal = {
                "code": "request.invalid",
                "message": f"the arguments are over {MAX_ARGUMENT_CHARS} characters",
            }
        arguments = _clean(arguments)
        if refusal is None and position >= MAX_TOOL_CALLS:
            refusal = {
                "code": "request.invalid",
                "message": f"not executed: at most {MAX_TOOL_CALLS} tool calls run per answer",
            }
        if refusal is None and spec is None:
            refusal = {
                "code": "request.invalid",
                "message": f"no tool named {name!r}",
                "details": {"tools": sorted(TOOLS_BY_NAME)},
            }
        if refusal is None and spec is not None:
            try:
                decode_arguments_json(arguments.encode(), spec.arguments)
            except ToolError as error:
                refusal = error_body(error)
        mutates = spec.mutates if spec is not None else False
        base = ToolCallRecord(
            id=f"atc_{uuid.uuid4().hex}",
            conversation_id=self.conversation.id,
            message_seq=seq,
            position=position,
            turn=self.turn.turn,
            tool=name,
            arguments=arguments,
            mutates=mutates,
            status="pending",
            created_at=now,
        )
        if refusal is not None:
            refusal.setdefault("details", None)
            return msgspec.structs.replace(
                base,
                status="failed",
                result=_error_text(refusal),
                error_code=refusal["code"],
                executed_at=now,
            )
        if last:
            skipped = {
                "code": "agent.step_limit",
                "message": f"not executed: the turn reached its {MAX_MODEL_CALLS} model calls",
                "details": None,
            }
            return msgspec.structs.replace(
                base, status="skipped", result=_error_text(skipped), error_code=skipped["code"]
            )
        if not mutates:
            return msgspec.structs.replace(base, status="approved", approval="read_only")
        if self.turn.allow_mutations:
            return msgspec.structs.replace(
                base, status="approved", approval="allowed", decided_at=now
            )
        return base

    async def _run_approved(self) -> None:
        """Run every approved tool call of the conversation, storing each result."""
        async with self.store.transaction() as tx:
            approved = await AgentTx(tx).list_tool_calls(
                self.tenant_id, self.conversation.id, status="approved"
            )
        for call in approved:
            result, truncated, code, status = await self._execute(call)
            now = self.clock.now()
            async with self.store.transaction() as tx:
                store = AgentTx(tx)
                renewed = msgspec.structs.replace(self.turn, lease_until=self._lease_until(now))
                await self._write_turn(store, renewed)
                await store.update_tool_call(
                    self.tenant_id,
                    self.conversation.id,
                    call.id,
                    status=status,
                    expect="approved",
                    result=result,
                    result_truncated=truncated,
                    error_code=code,
                    executed_at=now,
                )

    async def _execute(self, call: ToolCallRecord) -> tuple[str, bool, str | None, str]:
        """Run one tool call: (result text, truncated, error code, status)."""
        spec = TOOLS_BY_NAME[call.tool]
        services = self.services()
        try:
            args = decode_arguments_json(call.arguments.encode(), spec.arguments)
            if spec.mutates:
                # The call's own key: a resumed turn that runs it again changes nothing twice.
                args = msgspec.structs.replace(args, idempotency_key=f"agent:{call.id}")
            async with asyncio.timeout(TOOL_TIMEOUT):
                value = await spec.call(services, self.tenant_id, args)
        except DuctorError as error:
            text, truncated = _capped(_error_text(error_body(error)), MAX_RESULT_CHARS)
            return text, truncated, error.code, "failed"
        except TimeoutError:
            body = {
                "code": "agent.tool_timeout",
                "message": f"the tool did not answer within {TOOL_TIMEOUT:g}s",
                "details": None,
            }
            return _error_text(body), False, "agent.tool_timeout", "failed"
        except Exception:
            log.exception("tool %s of call %s failed", call.tool, call.id)
            body = {"code": "internal", "message": "internal server error", "details": None}
            return _error_text(body), False, "internal", "failed"
        if isinstance(value, Answer):
            value = value.value
        text, truncated = _capped(_json_text(builtins(value)), MAX_RESULT_CHARS)
        return text, truncated, None, "executed"


def _step_limit() -> dict[str, Any]:
    return {
        "code": "agent.step_limit",
        "message": f"the turn made {MAX_MODEL_CALLS} model calls without a final answer;"
        " send another message to go on",
        "details": {"limit": MAX_MODEL_CALLS},
    }


def _placed(error: DuctorError, conversation_id: str, turn: int) -> DuctorError:
    """`error` with the conversation and turn added to its details."""
    details = error.details
    place = {"conversation_id": conversation_id, "turn": turn}
    if details is None:
        details = place
    elif isinstance(details, dict):
        details = {**msgspec.to_builtins(details), **place}
    else:
        return error
    return ServerError(error.message, code=error.code, retryable=error.retryable, details=details)


def _stored_error(turn: TurnRecord) -> ServerError:
    body = turn.error or {}
    return ServerError(
        str(body.get("message") or "the turn failed"),
        code=str(body.get("code") or "internal"),
        details=body.get("details"),
    )


__all__ = [
    "MAX_MESSAGES",
    "MAX_MESSAGE_CHARS",
    "MAX_MODEL_CALLS",
    "MAX_RESULT_CHARS",
    "MAX_TOOL_CALLS",
    "MODEL_TOOLS",
    "SYSTEM_PROMPT",
    "AgentAnswer",
    "AgentService",
    "ConversationBody",
    "ConversationPage",
    "ConversationSummary",
    "ConversationView",
    "MessageBody",
    "MessageView",
    "ToolCallView",
    "TurnSummary",
    "TurnView",
    "check_conversation_body",
    "check_message_body",
    "transcript",
]
