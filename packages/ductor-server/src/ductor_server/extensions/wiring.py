"""Hands each extension point's loaded values to what uses it: registries of strategies,
enrichers and providers, the step specs and handlers, the hooks, the kind validators.

The composition root calls these once per process. A plugin that loaded but cannot
be plugged in (a step type or provider whose name is taken) is logged, listed as a
failure and skipped, like one that did not load.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from ductor_core.runs import RunFinished
from ductor_core.step_specs import StepSpec, StepSpecs
from ductor_routing import EnricherRegistry, StrategyRegistry
from ductor_server.engine.actions import ActionRegistry
from ductor_server.engine.effects import RunFinishedHook
from ductor_server.extensions.hooks import RUN_FINISHED, Hook, HookDispatcher
from ductor_server.extensions.kinds import KindValidators
from ductor_server.extensions.loader import (
    ExtensionFailure,
    Extensions,
    LoadedExtension,
    one_line,
)
from ductor_server.extensions.points import (
    ExtensionContractError,
    KindValidator,
    StepExtension,
)
from ductor_server.providers.base import Provider, ProviderRegistry
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import RunRecord

_log = logging.getLogger("ductor.extensions")

PLUGIN_REFUSED = "extension.refused"
"""The failure code of a plugin that loaded but whose name is taken where it plugs in."""


def _refuse(
    extensions: Extensions,
    group: str,
    entry: LoadedExtension,
    error: str,
    *,
    code: str = PLUGIN_REFUSED,
) -> None:
    extensions.loaded[group] = [(e, v) for e, v in extensions.loaded[group] if e is not entry]
    extensions.failures.append(
        ExtensionFailure(
            group=group,
            name=entry.name,
            distribution=entry.distribution,
            version=entry.version,
            object=entry.object,
            code=code,
            error=error,
        )
    )
    _log.error(
        "extension %s %r (%s %s, %s) skipped: %s",
        group,
        entry.name,
        entry.distribution,
        entry.version,
        entry.object,
        error,
    )


def plugin_strategies(extensions: Extensions) -> StrategyRegistry:
    """The built-in strategies plus the plugins' (`ductor.routing.strategies`)."""
    registry = StrategyRegistry()
    group = "ductor.routing.strategies"
    for entry, factory in extensions.values(group):
        if entry.name in registry.names():
            _refuse(extensions, group, entry, f"a strategy named {entry.name!r} is built in")
            continue
        registry.register(entry.name, factory)
    return registry


def plugin_enrichers(extensions: Extensions) -> EnricherRegistry:
    """The plugins' enricher factories (`ductor.routing.enrichers`)."""
    registry = EnricherRegistry()
    for entry, factory in extensions.values("ductor.routing.enrichers"):
        registry.register(entry.name, factory)
    return registry


def plugin_providers(extensions: Extensions, registry: ProviderRegistry) -> None:
    """Register the plugins' providers (`ductor.providers`) in `registry`, each with
    its distribution as origin."""
    group = "ductor.providers"
    for entry, provider in extensions.values(group):
        assert isinstance(provider, Provider)
        found = registry.get(provider.name)
        if found is not None:
            taken = f"a provider named {provider.name!r} comes from {registry.origin(found.name)}"
            _refuse(extensions, group, entry, taken)
            continue
        try:
            registry.register(provider, origin=entry.distribution or entry.object)
        except Exception as exc:  # its operations break the contract
            error = f"provider {entry.name!r}: {one_line(exc)}"
            _refuse(extensions, group, entry, error, code=ExtensionContractError.code)


def plugin_steps(extensions: Extensions, specs: StepSpecs, actions: ActionRegistry) -> StepSpecs:
    """`specs` with the plugins' step types (`ductor.steps`), their handlers registered
    in `actions`; `specs` itself when there are none."""
    group = "ductor.steps"
    added: list[StepSpec[Any]] = []
    for entry, step in extensions.values(group):
        assert isinstance(step, StepExtension)
        worker = step.spec.worker
        assert worker is not None
        handler = worker.handler
        if step.spec.type in specs or any(s.type == step.spec.type for s in added):
            _refuse(extensions, group, entry, f"the step type {step.spec.type} already exists")
            continue
        if actions.get(handler) is not None:
            _refuse(extensions, group, entry, f"a handler named {handler!r} already exists")
            continue
        actions.register(handler, step.handler)
        added.append(step.spec)
    return specs.with_specs(*added) if added else specs


async def _probe_app(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI app a middleware factory is tried on (never called)."""


def plugin_middleware(extensions: Extensions) -> list[Any]:
    """The plugins' middleware factories (`ductor.middleware`), each tried once on a
    stand-in app: one that raises or does not answer a callable is refused
    (`extension.contract`) instead of failing the server's start."""
    group = "ductor.middleware"
    usable = []
    for entry, factory in extensions.values(group):
        try:
            wrapped = factory(_probe_app)
        except (Exception, SystemExit) as exc:  # one that calls sys.exit() too
            error = f"middleware {entry.name!r}: calling it with an app raised {one_line(exc)}"
            _refuse(extensions, group, entry, error, code=ExtensionContractError.code)
            continue
        if not callable(wrapped):
            error = f"middleware {entry.name!r} answered {type(wrapped).__name__}, not an app"
            _refuse(extensions, group, entry, error, code=ExtensionContractError.code)
            continue
        usable.append(factory)
    return usable


def plugin_hooks(extensions: Extensions) -> list[tuple[str, Hook]]:
    """The plugins' lifecycle hooks (`ductor.hooks`), named for log lines."""
    return [
        (f"{entry.distribution}:{entry.name}", hook)
        for entry, hook in extensions.values("ductor.hooks")
    ]


def plugin_kinds(extensions: Extensions) -> KindValidators:
    """The plugins' routable kind validators (`ductor.kinds`), by kind."""
    validators: dict[str, KindValidator] = {
        entry.name: validator for entry, validator in extensions.values("ductor.kinds")
    }
    return KindValidators(validators)


def run_finished_hook(hooks: HookDispatcher) -> RunFinishedHook:
    """A run-finished hook of the engine that gives `run.finished` to `hooks` once the
    transaction ending the run commits."""

    async def on_finish(tx: Tx, *, run: RunRecord, finished: RunFinished, now: datetime) -> None:
        hooks.after_commit(
            tx,
            RUN_FINISHED,
            at=now,
            tenant_id=run.tenant_id,
            data={
                "run_id": run.id,
                "family_slug": run.family_slug,
                "version": run.version,
                "status": finished.status.value,
                "parent_run_id": run.parent_run_id,
            },
        )

    return on_finish


__all__ = [
    "PLUGIN_REFUSED",
    "plugin_enrichers",
    "plugin_hooks",
    "plugin_kinds",
    "plugin_middleware",
    "plugin_providers",
    "plugin_steps",
    "plugin_strategies",
    "run_finished_hook",
]
