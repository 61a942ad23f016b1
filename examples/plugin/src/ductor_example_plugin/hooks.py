"""A lifecycle hook (`ductor.hooks`): appends every event it is given, as a JSON line,
to the file `$DUCTOR_EXAMPLE_HOOK_LOG` (nothing when it is unset)."""

from __future__ import annotations

import asyncio
import json
import os

import msgspec

from ductor_server.extensions import HookEvent


async def record(event: HookEvent) -> None:
    """The hook: `(event) -> None`, called after the event's work committed."""
    path = os.environ.get("DUCTOR_EXAMPLE_HOOK_LOG")
    if not path:
        return
    line = json.dumps(msgspec.to_builtins(event))
    # Off the event loop: a hook must not block the server.
    await asyncio.to_thread(_append, path, line)


def _append(path: str, line: str) -> None:
    with open(path, "a", encoding="utf-8") as log:
        log.write(line + "\n")
