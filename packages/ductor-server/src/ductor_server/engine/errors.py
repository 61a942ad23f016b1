"""Errors of the engine's wiring, each a `DuctorError` with a stable code; no HTTP here.

DuctorError (ductor_core)
 └── ServerError
      └── EngineSetupError            engine.setup (a wiring mistake, found at start)
           ├── DuplicateRunKind       engine.duplicate_kind
           ├── UnknownRunKind         engine.unknown_kind
           └── DuplicateHandler       engine.duplicate_handler
      └── OffloadFailed               engine.offload_failed (retryable)

Setup errors are raised while a runtime is assembled, never for a tenant's
request; `OffloadFailed` when a worker process of an offload lane died mid-call.
"""

from __future__ import annotations

from ductor_server.errors import ServerError


class EngineSetupError(ServerError):
    """The engine was assembled wrongly (a programming error, not a tenant's)."""

    code = "engine.setup"
    retryable = False


class DuplicateRunKind(EngineSetupError):
    """A run kind whose name or slug prefix another registered kind already has."""

    code = "engine.duplicate_kind"


class UnknownRunKind(EngineSetupError):
    """A run kind this runtime has not registered."""

    code = "engine.unknown_kind"


class DuplicateHandler(EngineSetupError):
    """A step handler name registered twice without `replace=True`."""

    code = "engine.duplicate_handler"


class MissingHandler(EngineSetupError):
    """A worker-run step type whose handler no one registered on the runtime."""

    code = "engine.missing_handler"


class OffloadFailed(ServerError):
    """A worker process died while running a call (its lane has replaced it)."""

    code = "engine.offload_failed"
    retryable = True


__all__ = [
    "DuplicateHandler",
    "DuplicateRunKind",
    "EngineSetupError",
    "MissingHandler",
    "OffloadFailed",
    "UnknownRunKind",
]
