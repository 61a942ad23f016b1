"""SQL for the routing tables (migrations 0100-0199), over an open storage transaction.

Routing's own rows live here, written through the public storage `Session`:
`RoutingTx(tx)` wraps `tx.session` of either backend. Nothing here routes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import msgspec

from ductor_server.storage.protocol import Session, Tx

#: The configuration tables a tenant edits over the API (name -> table).
ENTITY_TABLES = {
    "worker": "routing_workers",
    "pool": "routing_pools",
    "settlement": "settlement_pools",
}

_ASSIGNMENT_COLS = (
    "tenant_id, id, decision_id, routable_id, pool, worker, channel, charge, status,"
    " reservations, origin, result, reason, created_at, updated_at"
)


class StoredReservation(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A counter an assignment holds: its stored key, the amount, and its scope."""

    key: str
    amount: int
    scope: str


class AssignmentRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `routing_assignments`."""

    tenant_id: str
    id: str
    decision_id: str
    routable_id: str
    pool: str
    worker: str
    channel: str
    charge: int
    status: str
    reservations: tuple[StoredReservation, ...]
    origin: str | None
    result: Any
    reason: str
    created_at: datetime
    updated_at: datetime


_reservations_decoder = msgspec.json.Decoder(tuple[StoredReservation, ...])

# "No limit", as a bound far above any counter (counters are bigint).
_NO_LIMIT = 2**62


class RoutingTx:
    """The routing tables, read and written through one storage transaction.

    Every statement takes the tenant.
    """

    def __init__(self, tx: Tx) -> None:
        self._db: Session = tx.session

    # --- configuration generation ------------------------------------------------

    async def generation(self, tenant_id: str) -> int:
        """How many times the tenant's routing configuration changed (0 if never)."""
        row = await self._db.fetch_one(
            "SELECT generation FROM routing_generations WHERE tenant_id = %s", (tenant_id,)
        )
        return 0 if row is None else int(row[0])

    async def bump_generation(self, tenant_id: str) -> int:
        """Count one more change; also serializes writers of the tenant's configuration."""
        row = await self._db.fetch_one(
            "INSERT INTO routing_generations (tenant_id, generation) VALUES (%s, 1)"
            " ON CONFLICT (tenant_id) DO UPDATE"
            " SET generation = routing_generations.generation + 1 RETURNING generation",
            (tenant_id,),
        )
        assert row is not None
        return int(row[0])

    # --- workers and pools ---------------------------------------------------------

    async def put_entity(
        self, table: str, tenant_id: str, entity_id: str, body: bytes, now: datetime
    ) -> bool:
        """Create or replace a worker or pool; True if it was created."""
        name = ENTITY_TABLES[table]
        existed = await self.get_entity(table, tenant_id, entity_id) is not None
        await self._db.execute(
            f"INSERT INTO {name} (tenant_id, id, body, updated_at) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, id) DO UPDATE"
            " SET body = excluded.body, updated_at = excluded.updated_at",
            (tenant_id, entity_id, body.decode(), self._db.to_timestamp(now)),
        )
        return not existed

    async def get_entity(self, table: str, tenant_id: str, entity_id: str) -> bytes | None:
        """One worker's or pool's JSON body, or None."""
        row = await self._db.fetch_one(
            f"SELECT body FROM {ENTITY_TABLES[table]} WHERE tenant_id = %s AND id = %s",
            (tenant_id, entity_id),
        )
        return None if row is None else _raw(row[0])

    async def list_entities(self, table: str, tenant_id: str) -> list[bytes]:
        """Every worker or pool body of the tenant, by id."""
        rows = await self._db.fetch_all(
            f"SELECT body FROM {ENTITY_TABLES[table]} WHERE tenant_id = %s ORDER BY id",
            (tenant_id,),
        )
        return [_raw(r[0]) for r in rows]

    async def delete_entity(self, table: str, tenant_id: str, entity_id: str) -> bool:
        """Delete a worker or pool; False if there was none."""
        count = await self._db.execute(
            f"DELETE FROM {ENTITY_TABLES[table]} WHERE tenant_id = %s AND id = %s",
            (tenant_id, entity_id),
        )
        return count > 0

    # --- rule sets -------------------------------------------------------------------

    async def insert_rule_set(self, tenant_id: str, body: bytes, now: datetime) -> int:
        """Store the next version of the tenant's rule set; returns its number.

        Call after `bump_generation` in the same transaction (that serializes writers).
        """
        row = await self._db.fetch_one(
            "SELECT COALESCE(MAX(version), 0) FROM routing_rule_sets WHERE tenant_id = %s",
            (tenant_id,),
        )
        version = (int(row[0]) if row is not None else 0) + 1
        await self._db.execute(
            "INSERT INTO routing_rule_sets (tenant_id, version, body, created_at)"
            " VALUES (%s, %s, %s, %s)",
            (tenant_id, version, body.decode(), self._db.to_timestamp(now)),
        )
        return version

    async def get_rule_set(
        self, tenant_id: str, version: int | None = None
    ) -> tuple[int, bytes, datetime] | None:
        """(version, body, created_at) of one version, or of the latest when None."""
        if version is None:
            row = await self._db.fetch_one(
                "SELECT version, body, created_at FROM routing_rule_sets WHERE tenant_id = %s"
                " ORDER BY version DESC LIMIT 1",
                (tenant_id,),
            )
        else:
            row = await self._db.fetch_one(
                "SELECT version, body, created_at FROM routing_rule_sets"
                " WHERE tenant_id = %s AND version = %s",
                (tenant_id, version),
            )
        if row is None:
            return None
        return int(row[0]), _raw(row[1]), self._db.from_timestamp(row[2])

    async def list_rule_set_versions(self, tenant_id: str) -> list[tuple[int, datetime]]:
        """Every (version, created_at) of the tenant's rule set, newest first."""
        rows = await self._db.fetch_all(
            "SELECT version, created_at FROM routing_rule_sets WHERE tenant_id = %s"
            " ORDER BY version DESC",
            (tenant_id,),
        )
        return [(int(r[0]), self._db.from_timestamp(r[1])) for r in rows]

    # --- counters and marks --------------------------------------------------------

    async def read_counters(self, tenant_id: str, keys: Sequence[str]) -> dict[str, int]:
        """The values of the counters among `keys` that exist."""
        found: dict[str, int] = {}
        for start in range(0, len(keys), 400):
            chunk = keys[start : start + 400]
            marks = ", ".join(["%s"] * len(chunk))
            rows = await self._db.fetch_all(
                "SELECT key, value FROM routing_counters"
                f" WHERE tenant_id = %s AND key IN ({marks})",
                (tenant_id, *chunk),
            )
            found.update((str(r[0]), int(r[1])) for r in rows)
        return found

    async def reserve(self, tenant_id: str, key: str, amount: int, limit: int | None) -> bool:
        """Add `amount` to a counter if the result stays <= `limit`; False (nothing
        changed) if it would not. Takes the row lock, so concurrent callers queue."""
        (done,) = await self.reserve_many(tenant_id, [(key, amount, limit)])
        return done

    async def reserve_many(
        self, tenant_id: str, reservations: Sequence[tuple[str, int, int | None]]
    ) -> list[bool]:
        """`reserve` each (key, amount, limit) in the given order, in one round trip
        where the backend can; per reservation, whether it fit. The caller rolls
        the transaction back if any did not."""
        out: list[bool] = [False] * len(reservations)
        batch: list[tuple[int, tuple[Any, ...]]] = [
            (i, (tenant_id, key, amount, _NO_LIMIT if limit is None else limit))
            for i, (key, amount, limit) in enumerate(reservations)
            if limit is None or amount <= limit
        ]
        if not batch:
            return out
        # One statement for every row keeps the caller's (sorted) lock order.
        rows = await self._db.executemany_returning(
            "INSERT INTO routing_counters (tenant_id, key, value) VALUES (%s, %s, %s)"
            " ON CONFLICT (tenant_id, key) DO UPDATE"
            " SET value = routing_counters.value + excluded.value"
            " WHERE routing_counters.value + excluded.value <= %s RETURNING value",
            [params for _, params in batch],
        )
        for (i, _), row in zip(batch, rows, strict=True):
            out[i] = row is not None
        return out

    async def release(self, tenant_id: str, key: str, amount: int) -> None:
        """Take `amount` off a counter, never below zero."""
        await self._db.execute(
            "UPDATE routing_counters SET value = CASE WHEN value < %s THEN 0 ELSE value - %s END"
            " WHERE tenant_id = %s AND key = %s",
            (amount, amount, tenant_id, key),
        )

    async def read_marks(
        self, tenant_id: str, scopes: Iterable[str]
    ) -> list[tuple[str, str, str, str]]:
        """Every (kind, scope, key, value) mark of the tenant in `scopes`."""
        wanted = sorted(set(scopes))
        out: list[tuple[str, str, str, str]] = []
        for start in range(0, len(wanted), 400):
            chunk = wanted[start : start + 400]
            marks = ", ".join(["%s"] * len(chunk))
            rows = await self._db.fetch_all(
                "SELECT kind, scope, key, value FROM routing_marks"
                f" WHERE tenant_id = %s AND scope IN ({marks})",
                (tenant_id, *chunk),
            )
            out.extend((str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows)
        return out

    async def set_marks(self, tenant_id: str, marks: Sequence[tuple[str, str, str, str]]) -> None:
        """Upsert (kind, scope, key, value) marks, in a stable order (no lock cycles),
        in one round trip where the backend can."""
        await self._db.executemany(
            "INSERT INTO routing_marks (tenant_id, kind, scope, key, value)"
            " VALUES (%s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, kind, scope, key) DO UPDATE SET value = excluded.value",
            [(tenant_id, *mark) for mark in sorted(set(marks))],
        )

    # --- decisions -------------------------------------------------------------------

    async def insert_decision(
        self,
        tenant_id: str,
        *,
        decision_id: str,
        routable_id: str,
        outcome: str,
        pool: str | None,
        worker: str | None,
        charge: int,
        body: bytes,
        now: datetime,
    ) -> bool:
        """Store a decision; False (nothing written) if its id is already taken."""
        row = await self._db.fetch_one(
            "INSERT INTO routing_decisions"
            " (tenant_id, id, routable_id, outcome, pool, worker, charge, body, created_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT (tenant_id, id) DO NOTHING RETURNING id",
            (
                tenant_id,
                decision_id,
                routable_id,
                outcome,
                pool,
                worker,
                charge,
                body.decode(),
                self._db.to_timestamp(now),
            ),
        )
        return row is not None

    async def get_decision(self, tenant_id: str, decision_id: str) -> bytes | None:
        """A decision's stored JSON, or None."""
        row = await self._db.fetch_one(
            "SELECT body FROM routing_decisions WHERE tenant_id = %s AND id = %s",
            (tenant_id, decision_id),
        )
        return None if row is None else _raw(row[0])

    async def list_pool_decisions(self, tenant_id: str, pool: str, *, limit: int) -> list[bytes]:
        """The pool's latest `limit` decisions, oldest first."""
        rows = await self._db.fetch_all(
            "SELECT body FROM routing_decisions WHERE tenant_id = %s AND pool = %s"
            " ORDER BY created_at DESC, id DESC LIMIT %s",
            (tenant_id, pool, limit),
        )
        return [_raw(r[0]) for r in reversed(rows)]

    # --- assignments -------------------------------------------------------------------

    async def insert_assignment(self, record: AssignmentRecord) -> None:
        """Store a new assignment."""
        ts = self._db.to_timestamp
        await self._db.execute(
            f"INSERT INTO routing_assignments ({_ASSIGNMENT_COLS})"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                record.tenant_id,
                record.id,
                record.decision_id,
                record.routable_id,
                record.pool,
                record.worker,
                record.channel,
                record.charge,
                record.status,
                msgspec.json.encode(record.reservations).decode(),
                record.origin,
                self._db.to_json(record.result),
                record.reason,
                ts(record.created_at),
                ts(record.updated_at),
            ),
        )

    async def get_assignment(
        self, tenant_id: str, assignment_id: str, *, lock: bool = False
    ) -> AssignmentRecord | None:
        """One assignment, or None; with `lock`, locked until this transaction ends (Postgres)."""
        suffix = " FOR UPDATE" if lock and self._db.backend == "postgres" else ""
        row = await self._db.fetch_one(
            f"SELECT {_ASSIGNMENT_COLS} FROM routing_assignments"
            f" WHERE tenant_id = %s AND id = %s{suffix}",
            (tenant_id, assignment_id),
        )
        return None if row is None else self._assignment(row)

    async def find_assignment_by_decision(
        self, tenant_id: str, decision_id: str
    ) -> AssignmentRecord | None:
        """The assignment a decision made, or None."""
        row = await self._db.fetch_one(
            f"SELECT {_ASSIGNMENT_COLS} FROM routing_assignments"
            " WHERE tenant_id = %s AND decision_id = %s",
            (tenant_id, decision_id),
        )
        return None if row is None else self._assignment(row)

    async def list_assignments_of_routable(
        self, tenant_id: str, routable_id: str
    ) -> list[AssignmentRecord]:
        """Every assignment of one routable, oldest first."""
        rows = await self._db.fetch_all(
            f"SELECT {_ASSIGNMENT_COLS} FROM routing_assignments"
            " WHERE tenant_id = %s AND routable_id = %s ORDER BY created_at, id",
            (tenant_id, routable_id),
        )
        return [self._assignment(r) for r in rows]

    async def list_assignments(
        self,
        tenant_id: str,
        *,
        routable_id: str | None = None,
        worker: str | None = None,
        status: str | None = None,
        after: AssignmentRecord | None = None,
        limit: int = 100,
    ) -> list[AssignmentRecord]:
        """Assignments matching every filter given, oldest first, at most `limit`;
        with `after`, those that come after it in that order."""
        where = ["tenant_id = %s"]
        params: list[Any] = [tenant_id]
        for column, value in (("routable_id", routable_id), ("worker", worker), ("status", status)):
            if value is not None:
                where.append(f"{column} = %s")
                params.append(value)
        if after is not None:
            where.append("(created_at > %s OR created_at = %s AND id > %s)")
            stamp = self._db.to_timestamp(after.created_at)
            params += [stamp, stamp, after.id]
        rows = await self._db.fetch_all(
            f"SELECT {_ASSIGNMENT_COLS} FROM routing_assignments WHERE {' AND '.join(where)}"
            " ORDER BY created_at, id LIMIT %s",
            (*params, limit),
        )
        return [self._assignment(r) for r in rows]

    async def count_assignments(self, tenant_id: str) -> dict[tuple[str, str, str], int]:
        """Assignments per (pool, worker, status) of the tenant."""
        rows = await self._db.fetch_all(
            "SELECT pool, worker, status, COUNT(*) FROM routing_assignments"
            " WHERE tenant_id = %s GROUP BY pool, worker, status",
            (tenant_id,),
        )
        return {(str(r[0]), str(r[1]), str(r[2])): int(r[3]) for r in rows}

    async def move_assignment(
        self,
        tenant_id: str,
        assignment_id: str,
        *,
        from_statuses: Sequence[str],
        to_status: str,
        result: Any,
        reason: str,
        now: datetime,
    ) -> bool:
        """Change an assignment's status if it is in one of `from_statuses`."""
        marks = ", ".join(["%s"] * len(from_statuses))
        count = await self._db.execute(
            "UPDATE routing_assignments SET status = %s, result = %s, reason = %s, updated_at = %s"
            f" WHERE tenant_id = %s AND id = %s AND status IN ({marks})",
            (
                to_status,
                self._db.to_json(result),
                reason,
                self._db.to_timestamp(now),
                tenant_id,
                assignment_id,
                *from_statuses,
            ),
        )
        return count > 0

    def _assignment(self, r: Sequence[Any]) -> AssignmentRecord:
        return AssignmentRecord(
            tenant_id=r[0],
            id=r[1],
            decision_id=r[2],
            routable_id=r[3],
            pool=r[4],
            worker=r[5],
            channel=r[6],
            charge=int(r[7]),
            status=r[8],
            reservations=_reservations_decoder.decode(_raw(r[9])),
            origin=r[10],
            result=self._db.from_json(r[11]),
            reason=r[12],
            created_at=self._db.from_timestamp(r[13]),
            updated_at=self._db.from_timestamp(r[14]),
        )


def _raw(value: Any) -> bytes:
    """A JSON column value (bytes on Postgres, text on SQLite) as bytes."""
    return value if isinstance(value, bytes) else str(value).encode()
