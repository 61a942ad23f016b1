"""SQL for the chat agent's tables (migration 0910): conversations, their messages,
the tool calls the model asked for, and the turns that did the work, over an open
storage transaction.

`AgentTx(tx)` reads and writes through `tx.session` of either backend and decides
nothing (the agent's rules are `services.agent`'s). Every statement takes the
tenant, and every statement about a conversation's rows takes the conversation.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec

from ductor_server.ai.store import newest_first
from ductor_server.storage.protocol import Row, Session, Tx


class ConversationRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A conversation: its model and upstream, and its running totals.

    Attributes:
        connection: the `openai` connection (None: the tenant's default at each call).
        create_key, create_hash: the Idempotency-Key that created it, and its request.
        turns, messages: how many turns and messages (user and assistant) it has;
            `messages` is also the `seq` of its next message.
        cost_micros: the cost of every model call of every turn.
    """

    tenant_id: str
    id: str
    title: str
    model: str
    connection: str | None = None
    instructions: str = ""
    create_key: str | None = None
    create_hash: str | None = None
    turns: int = 0
    messages: int = 0
    cost_micros: int = 0
    created_at: datetime
    updated_at: datetime


class MessageRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A user's or the model's message (`role` `user` or `assistant`)."""

    seq: int
    turn: int
    role: str
    content: str | None = None
    ai_request_id: str | None = None
    created_at: datetime


class ToolCallRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call the model asked for, in its message (`message_seq`, `position`).

    Attributes:
        arguments: the arguments as the model gave them (JSON text).
        status: `pending` (waits for the caller), `approved` (to run), `executed`,
            `failed`, `rejected` or `skipped`.
        approval: `read_only`, `allowed` (the request allowed mutations),
            `confirmed`, `rejected`, or None while pending (or refused unseen).
        result: what the model is sent as the call's result (JSON text).
        decided_turn: the turn of the request that confirmed or rejected it.
    """

    id: str
    conversation_id: str
    message_seq: int
    position: int
    turn: int
    tool: str
    arguments: str
    mutates: bool
    status: str
    approval: str | None = None
    result: str | None = None
    result_truncated: bool = False
    error_code: str | None = None
    created_at: datetime
    decided_at: datetime | None = None
    decided_turn: int | None = None
    executed_at: datetime | None = None


class TurnRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One request's work on a conversation.

    Attributes:
        status: `running`, `completed`, `awaiting_confirmation`, `step_limit`,
            `failed` or `interrupted`.
        error: `{code, message, details}` of a failed turn.
        ai_request_ids: the AI request record of each model call, in order.
        runner: the loop working on a running turn; `lease_until` until when.
    """

    conversation_id: str
    turn: int
    idempotency_key: str | None = None
    request_hash: str
    allow_mutations: bool = False
    runner: str
    status: str
    error: dict[str, Any] | None = None
    model_calls: int = 0
    ai_request_ids: list[str] = []
    cost_micros: int = 0
    lease_until: datetime
    created_at: datetime
    finished_at: datetime | None = None


_CONVERSATION_COLS = (
    "id, title, model, connection, instructions, create_key, create_hash, turns, messages,"
    " cost_micros, created_at, updated_at"
)
_MESSAGE_COLS = "seq, turn, role, content, ai_request_id, created_at"
_CALL_COLS = (
    "id, conversation_id, message_seq, position, turn, tool, arguments, mutates, status,"
    " approval, result, result_truncated, error_code, created_at, decided_at, decided_turn,"
    " executed_at"
)
_TURN_COLS = (
    "conversation_id, turn, idempotency_key, request_hash, allow_mutations, runner, status,"
    " error, model_calls, ai_request_ids, cost_micros, lease_until, created_at, finished_at"
)


class AgentTx:
    """The agent's tables, read and written through one storage transaction."""

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    async def lock(self, tenant_id: str, conversation_id: str) -> None:
        """Hold the conversation's lock until the transaction ends."""
        await self._db.advisory_lock(f"agent:{tenant_id}:{conversation_id}")

    # --- conversations -----------------------------------------------------------------

    async def insert_conversation(self, record: ConversationRecord) -> bool:
        """Store a new conversation; False (nothing written) when its `create_key` is taken."""
        db = self._db
        count = await db.execute(
            f"INSERT INTO agent_conversations (tenant_id, {_CONVERSATION_COLS}) VALUES ("
            + ", ".join(["%s"] * 13)
            + ") ON CONFLICT DO NOTHING",
            (
                record.tenant_id,
                record.id,
                record.title,
                record.model,
                record.connection,
                record.instructions,
                record.create_key,
                record.create_hash,
                record.turns,
                record.messages,
                record.cost_micros,
                db.to_timestamp(record.created_at),
                db.to_timestamp(record.updated_at),
            ),
        )
        return count > 0

    async def get_conversation(
        self, tenant_id: str, conversation_id: str
    ) -> ConversationRecord | None:
        """One conversation of the tenant, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_CONVERSATION_COLS} FROM agent_conversations"
            " WHERE tenant_id = %s AND id = %s",
            (tenant_id, conversation_id),
        )
        return None if row is None else self._conversation(tenant_id, row)

    async def find_conversation_by_key(
        self, tenant_id: str, create_key: str
    ) -> ConversationRecord | None:
        """The conversation created with this Idempotency-Key, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_CONVERSATION_COLS} FROM agent_conversations"
            " WHERE tenant_id = %s AND create_key = %s",
            (tenant_id, create_key),
        )
        return None if row is None else self._conversation(tenant_id, row)

    async def list_conversations(
        self, tenant_id: str, *, before: tuple[datetime, str] | None, limit: int
    ) -> list[ConversationRecord]:
        """The tenant's conversations, newest first, strictly before `before` (time, id)."""
        rows = await newest_first(
            self._db,
            f"SELECT {_CONVERSATION_COLS} FROM agent_conversations WHERE tenant_id = %s",
            tenant_id,
            before=before,
            limit=limit,
        )
        return [self._conversation(tenant_id, row) for row in rows]

    async def add_to_conversation(
        self,
        tenant_id: str,
        conversation_id: str,
        *,
        now: datetime,
        turns: int = 0,
        messages: int = 0,
        cost_micros: int = 0,
    ) -> None:
        """Add to the conversation's totals and set its `updated_at`."""
        await self._db.execute(
            "UPDATE agent_conversations SET turns = turns + %s, messages = messages + %s,"
            " cost_micros = cost_micros + %s, updated_at = %s WHERE tenant_id = %s AND id = %s",
            (
                turns,
                messages,
                cost_micros,
                self._db.to_timestamp(now),
                tenant_id,
                conversation_id,
            ),
        )

    def _conversation(self, tenant_id: str, row: Row) -> ConversationRecord:
        return ConversationRecord(
            tenant_id=tenant_id,
            id=row[0],
            title=row[1],
            model=row[2],
            connection=row[3],
            instructions=row[4],
            create_key=row[5],
            create_hash=row[6],
            turns=int(row[7]),
            messages=int(row[8]),
            cost_micros=int(row[9]),
            created_at=self._db.from_timestamp(row[10]),
            updated_at=self._db.from_timestamp(row[11]),
        )

    # --- messages ----------------------------------------------------------------------

    async def insert_message(
        self, tenant_id: str, conversation_id: str, record: MessageRecord
    ) -> None:
        """Store one message at its `seq`."""
        db = self._db
        await db.execute(
            f"INSERT INTO agent_messages (tenant_id, conversation_id, {_MESSAGE_COLS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            (
                tenant_id,
                conversation_id,
                record.seq,
                record.turn,
                record.role,
                record.content,
                record.ai_request_id,
                db.to_timestamp(record.created_at),
            ),
        )

    async def list_messages(self, tenant_id: str, conversation_id: str) -> list[MessageRecord]:
        """Every message of the conversation, in order."""
        rows = await self._db.fetch_all(
            f"SELECT {_MESSAGE_COLS} FROM agent_messages"
            " WHERE tenant_id = %s AND conversation_id = %s ORDER BY seq",
            (tenant_id, conversation_id),
        )
        return [
            MessageRecord(
                seq=int(row[0]),
                turn=int(row[1]),
                role=row[2],
                content=row[3],
                ai_request_id=row[4],
                created_at=self._db.from_timestamp(row[5]),
            )
            for row in rows
        ]

    # --- tool calls --------------------------------------------------------------------

    async def insert_tool_calls(self, tenant_id: str, records: Sequence[ToolCallRecord]) -> None:
        """Store the tool calls of one model answer."""
        if not records:
            return
        db = self._db
        await db.executemany(
            f"INSERT INTO agent_tool_calls (tenant_id, {_CALL_COLS}) VALUES ("
            + ", ".join(["%s"] * 18)
            + ")",
            [
                (
                    tenant_id,
                    r.id,
                    r.conversation_id,
                    r.message_seq,
                    r.position,
                    r.turn,
                    r.tool,
                    r.arguments,
                    r.mutates,
                    r.status,
                    r.approval,
                    r.result,
                    r.result_truncated,
                    r.error_code,
                    db.to_timestamp(r.created_at),
                    None if r.decided_at is None else db.to_timestamp(r.decided_at),
                    r.decided_turn,
                    None if r.executed_at is None else db.to_timestamp(r.executed_at),
                )
                for r in records
            ],
        )

    async def update_tool_call(
        self,
        tenant_id: str,
        conversation_id: str,
        call_id: str,
        *,
        status: str,
        expect: str,
        approval: str | None = None,
        result: str | None = None,
        result_truncated: bool = False,
        error_code: str | None = None,
        decided_at: datetime | None = None,
        decided_turn: int | None = None,
        executed_at: datetime | None = None,
    ) -> bool:
        """Move a call from status `expect` to `status`, setting what is given (the
        fields given as None keep their value); False when it was not in `expect`."""
        db = self._db
        count = await db.execute(
            "UPDATE agent_tool_calls SET status = %s, approval = COALESCE(%s, approval),"
            " result = COALESCE(%s, result), result_truncated = %s,"
            " error_code = COALESCE(%s, error_code), decided_at = COALESCE(%s, decided_at),"
            " decided_turn = COALESCE(%s, decided_turn), executed_at = COALESCE(%s, executed_at)"
            " WHERE tenant_id = %s AND conversation_id = %s AND id = %s AND status = %s",
            (
                status,
                approval,
                result,
                result_truncated,
                error_code,
                None if decided_at is None else db.to_timestamp(decided_at),
                decided_turn,
                None if executed_at is None else db.to_timestamp(executed_at),
                tenant_id,
                conversation_id,
                call_id,
                expect,
            ),
        )
        return count > 0

    async def list_tool_calls(
        self, tenant_id: str, conversation_id: str, *, status: str | None = None
    ) -> list[ToolCallRecord]:
        """The conversation's tool calls (of one `status`), in message order."""
        sql = f"SELECT {_CALL_COLS} FROM agent_tool_calls WHERE tenant_id = %s"
        sql += " AND conversation_id = %s"
        params: list[object] = [tenant_id, conversation_id]
        if status is not None:
            sql += " AND status = %s"
            params.append(status)
        rows = await self._db.fetch_all(sql + " ORDER BY message_seq, position", tuple(params))
        return [self._call(row) for row in rows]

    def _call(self, row: Row) -> ToolCallRecord:
        db = self._db
        return ToolCallRecord(
            id=row[0],
            conversation_id=row[1],
            message_seq=int(row[2]),
            position=int(row[3]),
            turn=int(row[4]),
            tool=row[5],
            arguments=row[6],
            mutates=bool(row[7]),
            status=row[8],
            approval=row[9],
            result=row[10],
            result_truncated=bool(row[11]),
            error_code=row[12],
            created_at=db.from_timestamp(row[13]),
            decided_at=None if row[14] is None else db.from_timestamp(row[14]),
            decided_turn=None if row[15] is None else int(row[15]),
            executed_at=None if row[16] is None else db.from_timestamp(row[16]),
        )

    # --- turns -------------------------------------------------------------------------

    async def insert_turn(self, tenant_id: str, record: TurnRecord) -> bool:
        """Store a new turn; False (nothing written) when its idempotency key is taken."""
        db = self._db
        count = await db.execute(
            f"INSERT INTO agent_turns (tenant_id, {_TURN_COLS}) VALUES ("
            + ", ".join(["%s"] * 15)
            + ") ON CONFLICT DO NOTHING",
            (
                tenant_id,
                record.conversation_id,
                record.turn,
                record.idempotency_key,
                record.request_hash,
                record.allow_mutations,
                record.runner,
                record.status,
                db.to_json(record.error),
                record.model_calls,
                db.to_json(record.ai_request_ids),
                record.cost_micros,
                db.to_timestamp(record.lease_until),
                db.to_timestamp(record.created_at),
                None if record.finished_at is None else db.to_timestamp(record.finished_at),
            ),
        )
        return count > 0

    async def get_turn(self, tenant_id: str, conversation_id: str, turn: int) -> TurnRecord | None:
        """One turn, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_TURN_COLS} FROM agent_turns"
            " WHERE tenant_id = %s AND conversation_id = %s AND turn = %s",
            (tenant_id, conversation_id, turn),
        )
        return None if row is None else self._turn(row)

    async def find_turn_by_key(
        self, tenant_id: str, conversation_id: str, key: str
    ) -> TurnRecord | None:
        """The turn of this Idempotency-Key, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_TURN_COLS} FROM agent_turns"
            " WHERE tenant_id = %s AND conversation_id = %s AND idempotency_key = %s",
            (tenant_id, conversation_id, key),
        )
        return None if row is None else self._turn(row)

    async def list_turns(self, tenant_id: str, conversation_id: str) -> list[TurnRecord]:
        """Every turn of the conversation, in order."""
        rows = await self._db.fetch_all(
            f"SELECT {_TURN_COLS} FROM agent_turns"
            " WHERE tenant_id = %s AND conversation_id = %s ORDER BY turn",
            (tenant_id, conversation_id),
        )
        return [self._turn(row) for row in rows]

    async def running_turns(self, tenant_id: str, conversation_id: str) -> list[TurnRecord]:
        """The conversation's turns still `running` (at most one, unless one was left)."""
        rows = await self._db.fetch_all(
            f"SELECT {_TURN_COLS} FROM agent_turns WHERE tenant_id = %s"
            " AND conversation_id = %s AND status = 'running' ORDER BY turn",
            (tenant_id, conversation_id),
        )
        return [self._turn(row) for row in rows]

    async def update_turn(
        self,
        tenant_id: str,
        record: TurnRecord,
        *,
        runner: str | None,
    ) -> bool:
        """Write a turn's state; with `runner`, only while it is running by that runner
        (False when another loop took it over or it ended)."""
        db = self._db
        sql = (
            "UPDATE agent_turns SET runner = %s, status = %s, error = %s, model_calls = %s,"
            " ai_request_ids = %s, cost_micros = %s, lease_until = %s, finished_at = %s"
            " WHERE tenant_id = %s AND conversation_id = %s AND turn = %s"
        )
        params: list[object] = [
            record.runner,
            record.status,
            db.to_json(record.error),
            record.model_calls,
            db.to_json(record.ai_request_ids),
            record.cost_micros,
            db.to_timestamp(record.lease_until),
            None if record.finished_at is None else db.to_timestamp(record.finished_at),
            tenant_id,
            record.conversation_id,
            record.turn,
        ]
        if runner is not None:
            sql += " AND status = 'running' AND runner = %s"
            params.append(runner)
        return await db.execute(sql, tuple(params)) > 0

    async def extend_turn(
        self, tenant_id: str, conversation_id: str, turn: int, *, runner: str, lease_until: datetime
    ) -> bool:
        """Move a running turn's lease to `lease_until`, only while that runner holds it
        (False when another loop took it over or it ended)."""
        db = self._db
        count = await db.execute(
            "UPDATE agent_turns SET lease_until = %s WHERE tenant_id = %s"
            " AND conversation_id = %s AND turn = %s AND status = 'running' AND runner = %s",
            (db.to_timestamp(lease_until), tenant_id, conversation_id, turn, runner),
        )
        return count > 0

    def _turn(self, row: Row) -> TurnRecord:
        db = self._db
        ids = db.from_json(row[9])
        return TurnRecord(
            conversation_id=row[0],
            turn=int(row[1]),
            idempotency_key=row[2],
            request_hash=row[3],
            allow_mutations=bool(row[4]),
            runner=row[5],
            status=row[6],
            error=db.from_json(row[7]),
            model_calls=int(row[8]),
            ai_request_ids=[str(i) for i in ids] if isinstance(ids, list) else [],
            cost_micros=int(row[10]),
            lease_until=db.from_timestamp(row[11]),
            created_at=db.from_timestamp(row[12]),
            finished_at=None if row[13] is None else db.from_timestamp(row[13]),
        )


__all__ = ["AgentTx", "ConversationRecord", "MessageRecord", "ToolCallRecord", "TurnRecord"]
