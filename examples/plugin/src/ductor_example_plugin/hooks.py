"""A lifecycle hook (`ductor.hooks`): appends every event it is given, as a JSON line,
to the file `$DUCTOR_EXAMPLE_HOOK_LOG` (nothing when it is unset)."""

from __future__ import annotations

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
    with open(path, "a", encoding="utf-8") as log:
        log.write(line + "\n")
