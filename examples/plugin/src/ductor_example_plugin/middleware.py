"""API middleware (`ductor.middleware`): an audit log of the requests made with each key.

Appends one JSON line per `/v1` request to the file `$DUCTOR_EXAMPLE_AUDIT_LOG`
(nothing when it is unset): method, path, status and the API key's public prefix.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

Scope = dict[str, Any]
ASGIApp = Any


def _key_prefix(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            token = value.decode("latin-1").removeprefix("Bearer ").strip()
            return token[:12] or None
    return None


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as log:
        log.write(line + "\n")


def audit(app: ASGIApp) -> ASGIApp:
    """The middleware factory: `(app) -> app`."""

    async def audited(scope: Scope, receive: Any, send: Any) -> None:
        path = os.environ.get("DUCTOR_EXAMPLE_AUDIT_LOG")
        if scope["type"] != "http" or not path:
            await app(scope, receive, send)
            return
        status: list[int] = []

        async def sending(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        try:
            await app(scope, receive, sending)
        finally:
            line = {
                "method": scope["method"],
                "path": scope["path"],
                "status": status[0] if status else None,
                "key": _key_prefix(scope),
            }
            await asyncio.to_thread(_append, path, json.dumps(line))

    return audited
