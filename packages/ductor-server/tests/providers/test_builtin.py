"""builtin_providers(): the five built-ins, each keeping the contract, with JSON
schemas for their settings, secrets, inputs and outputs."""

from __future__ import annotations

import msgspec
import pytest

from ductor_server.providers import (
    HttpProvider,
    Provider,
    ProviderRegistry,
    ProviderSetupError,
    builtin_providers,
)


def test_the_builtins() -> None:
    registry = builtin_providers()
    assert [p.name for p in registry] == ["http", "openai", "slack", "smtp", "webhook"]
    assert {
        name: sorted(registry.get(name).operations)
        for name in ("http", "openai", "slack", "smtp", "webhook")
    } == {  # type: ignore[union-attr]
        "http": ["request"],
        "openai": ["chat"],
        "slack": ["post_message"],
        "smtp": ["send"],
        "webhook": ["send"],
    }
    for provider in registry:
        assert isinstance(provider, Provider)
        assert registry.origin(provider.name) == "builtin"


def test_each_call_builds_a_new_registry() -> None:
    first, second = builtin_providers(), builtin_providers()
    assert first is not second
    with pytest.raises(ProviderSetupError):
        first.register(HttpProvider(), origin="some-plugin")
    assert first.origin("http") == "builtin"


def test_a_provider_class_is_not_a_provider() -> None:
    # A class has every attribute of a Provider (its methods unbound); only an
    # instance can be called.
    registry = ProviderRegistry()
    with pytest.raises(ProviderSetupError, match="not a provider"):
        registry.register(HttpProvider)  # type: ignore[arg-type]
    assert len(registry) == 0


def test_schemas() -> None:
    titles: set[str] = set()
    for provider in builtin_providers():
        for tp in (provider.settings, provider.secrets):
            (_schema,), defs = msgspec.json.schema_components([tp])
            assert defs
        for op in provider.operations.values():
            inputs = op.input_schema()
            outputs = op.output_schema()
            assert inputs["$defs"]
            assert outputs["$defs"]
            titles.add(next(iter(inputs["$defs"])))
    assert len(titles) == 5  # every operation's input has its own name
