"""The expression sandbox: costly CEL evaluated in capped, killable child processes.

cel-rust cannot be interrupted inside the server's process; an evaluation the
static estimate misjudges could take minutes or abort the process. Expressions
estimated at `threshold` units or more (at compile time, or again with the
variables of an evaluation) run here instead, with a memory cap and
a deadline (see docs/expressions.md, "The server's runtime limit").
"""

from __future__ import annotations

from ductor_server.sandbox.child import RESOURCE_EXHAUSTED
from ductor_server.sandbox.engine import (
    DEFAULT_THRESHOLD,
    SandboxedEngine,
    SandboxedProgram,
    WatchedProgram,
)
from ductor_server.sandbox.pool import SANDBOX_UNAVAILABLE, SandboxLimits, SandboxPool

__all__ = [
    "DEFAULT_THRESHOLD",
    "RESOURCE_EXHAUSTED",
    "SANDBOX_UNAVAILABLE",
    "SandboxLimits",
    "SandboxPool",
    "SandboxedEngine",
    "SandboxedProgram",
    "WatchedProgram",
]
