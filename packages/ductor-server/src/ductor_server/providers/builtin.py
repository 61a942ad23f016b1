"""The built-in providers, registered under their names in one new registry.

It holds no state of its own: each call builds a fresh registry, so a server (or
a test) adds its plugins to its own copy.
"""

from __future__ import annotations

from ductor_server.providers.base import ProviderRegistry
from ductor_server.providers.http import HttpProvider
from ductor_server.providers.webhook import WebhookProvider


def builtin_providers() -> ProviderRegistry:
    """A new registry holding the built-in providers (origin `builtin`)."""
    registry = ProviderRegistry()
    for provider in (HttpProvider(), WebhookProvider()):
        registry.register(provider, origin="builtin")
    return registry


__all__ = ["builtin_providers"]
