"""Server configuration, read from flags and the environment at the edge only."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How one `ductor` process is configured.

    With no `database_url` the server runs on its embedded default: a SQLite
    file under `data_dir` and an in-process queue.
    """

    host: str = "127.0.0.1"
    port: int = 7070
    data_dir: Path = field(default_factory=lambda: Path(".ductor"))
    database_url: str | None = None
    redis_url: str | None = None

    @property
    def embedded(self) -> bool:
        """True when the server stores everything in SQLite under `data_dir`."""
        return self.database_url is None

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Build settings from `DUCTOR_*` environment variables, then overrides."""
        values: dict[str, object] = {}
        if url := os.environ.get("DUCTOR_DATABASE_URL"):
            values["database_url"] = url
        if url := os.environ.get("DUCTOR_REDIS_URL"):
            values["redis_url"] = url
        if data_dir := os.environ.get("DUCTOR_DATA_DIR"):
            values["data_dir"] = Path(data_dir)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
