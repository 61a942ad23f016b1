"""An example Ductor plugin: one extension of each extension point (see the entry
points in pyproject.toml and docs/extending.md)."""

from __future__ import annotations

__all__: list[str] = []
