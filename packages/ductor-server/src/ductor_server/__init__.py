"""The Ductor service: API, storage, queue, coordinator, workers and the `ductor` CLI.

`create_app` is imported on first use, so the CLI's client commands start
without loading the web framework and the expression engines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ductor_server.settings import Settings

if TYPE_CHECKING:
    from ductor_server.app import create_app

__version__ = "0.1.0"

__all__ = ["Settings", "__version__", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from ductor_server.app import create_app

        return create_app
    raise AttributeError(f"module 'ductor_server' has no attribute {name!r}")
