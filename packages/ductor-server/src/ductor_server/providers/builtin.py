"""The built-in providers, registered under their names in one new registry.

It holds no state of its own: each call builds a fresh registry, so a server (or
a test) adds its plugins to its own copy.
"""

from __future__ import annotations

from ductor_server.providers.base import Provider, ProviderRegistry
from ductor_server.providers.http import HttpProvider
from ductor_server.providers.openai import OpenAIProvider
from ductor_server.providers.slack import SlackProvider
from ductor_server.providers.smtp import SmtpProvider
from ductor_server.providers.webhook import WebhookProvider


def builtin_providers() -> ProviderRegistry:
    """A new registry holding the built-in providers (origin `builtin`)."""
    registry = ProviderRegistry()
    builtins: tuple[Provider, ...] = (
        HttpProvider(),
        OpenAIProvider(),
        SlackProvider(),
        SmtpProvider(),
        WebhookProvider(),
    )
    for provider in builtins:
        registry.register(provider, origin="builtin")
    return registry


__all__ = ["builtin_providers"]
