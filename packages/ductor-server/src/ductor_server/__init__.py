"""The Ductor service: API, storage, queue, coordinator, workers and the `ductor` CLI."""

from __future__ import annotations

from ductor_server.app import create_app
from ductor_server.settings import Settings

__version__ = "0.1.0"

__all__ = ["Settings", "__version__", "create_app"]
