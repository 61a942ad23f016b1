"""Providers: the kinds of outside system ACTION steps reach through a tenant's
connections. The contract is in `base`; the built-in providers sit beside it.
"""

from __future__ import annotations

from ductor_server.providers.base import (
    CallContext,
    CheckResult,
    Operation,
    Provider,
    ProviderFailed,
    ProviderRegistry,
    ProviderSetupError,
    Redactor,
    provider_failure,
)
from ductor_server.providers.builtin import builtin_providers
from ductor_server.providers.http import HttpProvider
from ductor_server.providers.openai import OpenAIProvider
from ductor_server.providers.slack import SlackProvider
from ductor_server.providers.smtp import SmtpProvider
from ductor_server.providers.webhook import WebhookProvider

__all__ = [
    "CallContext",
    "CheckResult",
    "HttpProvider",
    "OpenAIProvider",
    "Operation",
    "Provider",
    "ProviderFailed",
    "ProviderRegistry",
    "ProviderSetupError",
    "Redactor",
    "SlackProvider",
    "SmtpProvider",
    "WebhookProvider",
    "builtin_providers",
    "provider_failure",
]
