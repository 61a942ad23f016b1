"""The Ductor bridge SDK: host durable workflows in application code."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
