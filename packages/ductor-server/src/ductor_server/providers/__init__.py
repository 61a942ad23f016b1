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
    provider_failure,
)

__all__ = [
    "CallContext",
    "CheckResult",
    "Operation",
    "Provider",
    "ProviderFailed",
    "ProviderRegistry",
    "ProviderSetupError",
    "provider_failure",
]
