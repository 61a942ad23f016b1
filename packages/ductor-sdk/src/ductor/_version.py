"""The SDK's version, in one place so every module can read it without import cycles."""

from __future__ import annotations

__version__ = "0.1.0"
