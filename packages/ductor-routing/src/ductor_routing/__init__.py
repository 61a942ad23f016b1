"""Ductor's routing pipeline, pure: no I/O, no clock reads."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
