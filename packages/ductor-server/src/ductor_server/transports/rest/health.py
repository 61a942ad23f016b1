"""`/healthz` (the process is up) and `/readyz` (its store, which holds the durable
queue, answers). No auth.

Redis is not checked: it carries wake-ups and the fair queue's fast path, which
the engine rebuilds from the store, so a process without it still does its work
(slower) and is ready.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from litestar import Request, Response, get

READY_TIMEOUT_SECONDS = 2.0


class Health(msgspec.Struct, frozen=True, kw_only=True):
    """Liveness or readiness; `checks` names each dependency and whether it answered."""

    status: str
    checks: dict[str, str] = {}


@get("/healthz", sync_to_thread=False, tags=["health"])
def healthz() -> dict[str, str]:
    """Liveness: the process is up and serving."""
    return {"status": "ok"}


async def _check(probe: Any) -> str:
    try:
        await asyncio.wait_for(probe(), READY_TIMEOUT_SECONDS)
    except TimeoutError:
        # A dependency that hangs (a dropped connection, a full pool) says nothing
        # of itself: name the wait, not an empty exception.
        return f"error: no answer within {READY_TIMEOUT_SECONDS:g} s"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    return "ok"


@get("/readyz", tags=["health"])
async def readyz(request: Request[Any, Any, Any]) -> Response[Health]:
    """Readiness: the store, and so the durable queue in it, answers (503 otherwise)."""
    composition = request.app.state.composition
    store = await _check(composition.store.ping)
    # The durable queue is a table of the store: reachable when the store is.
    checks = {"store": store, "queue": store}
    ok = all(v == "ok" for v in checks.values())
    return Response(
        Health(status="ok" if ok else "unavailable", checks=checks),
        status_code=200 if ok else 503,
    )
