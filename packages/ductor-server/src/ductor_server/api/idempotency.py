"""Idempotency keys for mutating endpoints: replay the stored answer, refuse a changed body.

Only successful answers are stored, so a failed request leaves nothing behind
and may be retried with the same key. No route handlers here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from litestar import MediaType, Response

from ductor_server.api.errors import ApiError
from ductor_server.errors import IdempotencyConflict
from ductor_server.storage.records import IdempotencyRecord

T = TypeVar("T")

MAX_KEY_LENGTH = 255
REPLAYED_HEADER = "Idempotency-Replayed"


def request_fingerprint(scope: str, body: Any) -> str:
    """SHA-256 of the scope and the decoded body, keys sorted (whitespace does not count)."""
    canonical = msgspec.json.encode(msgspec.to_builtins(body), order="sorted")
    return hashlib.sha256(scope.encode() + b"\n" + canonical).hexdigest()


def check_key(key: str | None) -> str | None:
    """Reject an empty or oversized key; None means the request is not idempotent."""
    if key is None:
        return None
    if not key.strip() or len(key) > MAX_KEY_LENGTH:
        raise ApiError(
            f"Idempotency-Key must be 1 to {MAX_KEY_LENGTH} characters",
            code="request.invalid",
            details={"header": "Idempotency-Key"},
        )
    return key


async def run_idempotent(
    store: Any,
    *,
    tenant_id: str,
    scope: str,
    key: str | None,
    body: Any,
    into: type[T],
    produce: Callable[[], Awaitable[tuple[int, T]]],
    now: datetime,
) -> Response[T]:
    """Answer a mutating request at most once per (tenant, scope, key).

    Args:
        store: the `Store`.
        tenant_id: whose key it is.
        scope: method and path, so one key can't answer two different endpoints.
        key: the `Idempotency-Key` header, or None to just run `produce`.
        body: the decoded request body (fingerprinted).
        into: the response type, to decode a stored answer.
        produce: does the work; returns (status, value).
        now: when the answer is remembered (for expiry).

    Raises:
        IdempotencyConflict: the key was used before with a different request.
    """
    key = check_key(key)
    if key is None:
        status, value = await produce()
        return Response(content=value, status_code=status, media_type=MediaType.JSON)
    fingerprint = request_fingerprint(scope, body)
    async with store.transaction() as tx:
        found: IdempotencyRecord | None = await tx.get_idempotency(tenant_id, scope, key)
    if found is None:
        status, value = await produce()
        record = IdempotencyRecord(
            tenant_id=tenant_id,
            scope=scope,
            key=key,
            request_hash=fingerprint,
            status_code=status,
            response=msgspec.json.decode(msgspec.json.encode(value)),
            created_at=now,
        )
        async with store.transaction() as tx:
            stored = await tx.put_idempotency(record)
            if not stored:
                # A concurrent request with the same key answered first.
                found = await tx.get_idempotency(tenant_id, scope, key)
        if found is None:
            return Response(content=value, status_code=status, media_type=MediaType.JSON)
    if found.request_hash != fingerprint:
        raise IdempotencyConflict(
            "this Idempotency-Key was already used with a different request",
            details={"key": key, "scope": scope},
        )
    replay = msgspec.convert(found.response, into)
    return Response(
        content=replay,
        status_code=found.status_code,
        media_type=MediaType.JSON,
        headers={REPLAYED_HEADER: "true"},
    )
