"""Ductor's pure domain: definitions, validation, expressions and the tick. No I/O."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
