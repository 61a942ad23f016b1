"""The eight extension points: each one's entry-point group, its contract, and the
check that a loaded object keeps it.

A check takes the entry point's name and the object it names and returns the
value the server uses, or raises `ExtensionContractError` saying what does not
fit. Checks import nothing of a plugin's and call nothing of it except where the
contract is "a class or a zero-argument factory" (providers).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ductor_core.expressions import builtin_registry
from ductor_core.step_specs import StepSpec
from ductor_routing.kinds import Problem
from ductor_routing.routables import Routable
from ductor_server.engine.actions import ActionCall
from ductor_server.extensions.hooks import Hook
from ductor_server.providers.base import Provider


class ExtensionContractError(Exception):
    """A plugin object does not keep its extension point's contract.

    Never raised to a caller: the loader turns it into a listed failure with
    this `code`.
    """

    code = "extension.contract"


StepHandler = Callable[[ActionCall], Awaitable[Any]]
"""A step type's handler: the attempt's call in, the step's output (JSON) out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepExtension:
    """What a `ductor.steps` entry point names: a worker-run step type and its handler.

    Attributes:
        spec: the core `StepSpec`; its `start` must be `OnWorker(handler=...)`.
        handler: an async function `(ActionCall) -> output`, registered under
            the spec's handler name; it raises `ActionFailed` to fail the attempt.
    """

    spec: StepSpec[Any]
    handler: StepHandler


class KindValidator(Protocol):
    """What a `ductor.kinds` entry point names: checks a routable of the kind the entry
    point is named after, returning every problem (none: valid)."""

    def __call__(self, routable: Routable, /) -> Iterable[Problem]: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ExtensionPoint:
    """One extension point.

    Attributes:
        group: the entry-point group plugins publish under.
        title: a few words for listings.
        contract: what the named object must be, in one line.
        check: turns the loaded object into what the server uses, or raises
            `ExtensionContractError`.
    """

    group: str
    title: str
    contract: str
    check: Callable[[str, Any], Any]


def _callable(name: str, obj: Any, what: str) -> Any:
    if not callable(obj):
        raise ExtensionContractError(f"{name!r} must be {what}, got {type(obj).__name__}")
    return obj


def _is_async(obj: Any) -> bool:
    return inspect.iscoroutinefunction(obj) or inspect.iscoroutinefunction(
        getattr(obj, "__call__", None)  # noqa: B004 - an instance with an async __call__
    )


def check_strategy(name: str, obj: Any) -> Any:
    """A strategy factory `(options, registry) -> Strategy`."""
    return _callable(name, obj, "a strategy factory (options, registry) -> Strategy")


def check_enricher(name: str, obj: Any) -> Any:
    """An enricher factory `(options) -> Enricher`."""
    return _callable(name, obj, "an enricher factory (options) -> Enricher")


def check_cel_function(name: str, obj: Any) -> Any:
    """A pure function over JSON values, registered as the CEL function `name`."""
    _callable(name, obj, "a function over JSON values")
    try:
        builtin_registry().register(name, obj)
    except ValueError as exc:
        raise ExtensionContractError(f"CEL function {name!r}: {exc}") from exc
    return obj


def check_provider(name: str, obj: Any) -> Provider:
    """A `Provider` (or a class or zero-argument factory making one) named `name`."""
    provider = obj
    # A class has every attribute a Provider has (its methods unbound): build it.
    if isinstance(provider, type) or (not isinstance(provider, Provider) and callable(provider)):
        try:
            provider = provider()
        except Exception as exc:
            raise ExtensionContractError(f"provider {name!r}: building it failed: {exc}") from exc
    if not isinstance(provider, Provider):
        raise ExtensionContractError(
            f"{name!r} must be a Provider (name, description, settings, secrets, operations,"
            f" call, test: ductor_server.providers), got {type(provider).__name__}"
        )
    if provider.name != name:
        raise ExtensionContractError(
            f"the entry point {name!r} names a provider called {provider.name!r}; use one name"
        )
    return provider


def check_step(name: str, obj: Any) -> StepExtension:
    """A `StepExtension` whose spec is worker-run and whose handler is async."""
    if not isinstance(obj, StepExtension):
        raise ExtensionContractError(
            f"{name!r} must be a ductor_server.extensions.StepExtension(spec=..., handler=...),"
            f" got {type(obj).__name__}"
        )
    if not isinstance(obj.spec, StepSpec) or obj.spec.worker is None:
        raise ExtensionContractError(
            f"step {name!r}: spec must be a StepSpec with start=OnWorker(handler=...)"
        )
    if not _is_async(obj.handler):
        raise ExtensionContractError(f"step {name!r}: handler must be an async function")
    return obj


def check_middleware(name: str, obj: Any) -> Any:
    """An ASGI middleware factory `(app) -> app` (a Litestar middleware)."""
    return _callable(name, obj, "an ASGI middleware factory (app) -> app")


def check_hook(name: str, obj: Any) -> Hook:
    """An async function `(HookEvent) -> None`."""
    if not _is_async(obj):
        raise ExtensionContractError(
            f"{name!r} must be an async function (event: HookEvent) -> None"
        )
    hook: Hook = obj
    return hook


def check_kind(name: str, obj: Any) -> KindValidator:
    """A function `(Routable) -> Iterable[Problem]` for the kind `name`."""
    validator: KindValidator = _callable(
        name, obj, "a validator (routable) -> iterable of Problem(pointer, message)"
    )
    return validator


POINTS: tuple[ExtensionPoint, ...] = (
    ExtensionPoint(
        group="ductor.routing.strategies",
        title="routing strategies",
        contract="a factory (options, registry) -> Strategy; the entry point's name is the"
        " strategy's name",
        check=check_strategy,
    ),
    ExtensionPoint(
        group="ductor.routing.enrichers",
        title="routing enrichers",
        contract="a factory (options) -> Enricher; the entry point's name is the plugin's name",
        check=check_enricher,
    ),
    ExtensionPoint(
        group="ductor.cel.functions",
        title="CEL functions",
        contract="a pure function over JSON values; the entry point's name is the CEL name",
        check=check_cel_function,
    ),
    ExtensionPoint(
        group="ductor.providers",
        title="providers",
        contract="a Provider (or a class making one) whose name is the entry point's name",
        check=check_provider,
    ),
    ExtensionPoint(
        group="ductor.steps",
        title="step types",
        contract="a StepExtension(spec=StepSpec(..., start=OnWorker(...)), handler=async fn)",
        check=check_step,
    ),
    ExtensionPoint(
        group="ductor.middleware",
        title="API middleware",
        contract="an ASGI middleware factory (app) -> app, wrapped around every /v1 route",
        check=check_middleware,
    ),
    ExtensionPoint(
        group="ductor.hooks",
        title="lifecycle hooks",
        contract="an async function (event: HookEvent) -> None",
        check=check_hook,
    ),
    ExtensionPoint(
        group="ductor.kinds",
        title="routable kind validators",
        contract="a function (routable) -> iterable of Problem; the entry point's name is the kind",
        check=check_kind,
    ),
)
"""Every extension point, in the order they are listed."""

POINTS_BY_GROUP = {point.group: point for point in POINTS}
