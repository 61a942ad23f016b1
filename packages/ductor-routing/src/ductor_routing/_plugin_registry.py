"""The shared core of the strategy and enricher registries: factories by name.

Holds registration, listing and entry-point loading; it never discovers plugins
on its own — `discover()` reads installed package metadata only when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any, ClassVar, Generic, TypeVar

from ductor_core.errors import DuctorError, fault_text
from ductor_routing.errors import ConfigError

F = TypeVar("F")


class PluginRegistry(Generic[F]):
    """Factories of one plugin kind by name.

    Subclasses set `kind` (named in error messages) and `entry_point_group`.
    """

    kind: ClassVar[str]
    entry_point_group: ClassVar[str]

    def __init__(self, factories: dict[str, F] | None = None) -> None:
        self._factories: dict[str, F] = {} if factories is None else factories

    def register(self, name: str, factory: F, *, replace: bool = False) -> None:
        """Add a factory under `name`; refuses to shadow an existing one unless `replace`."""
        if name in self._factories and not replace:
            raise ConfigError(f"{self.kind} {name!r} is already registered")
        self._factories[name] = factory

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted."""
        return tuple(sorted(self._factories))

    def load_entry_points(self, entry_points: Iterable[metadata.EntryPoint]) -> tuple[str, ...]:
        """Register the factory each entry point names; return the names added."""
        added = []
        for ep in entry_points:
            factory: Any = ep.load()
            if not callable(factory):
                raise ConfigError(f"entry point {ep.name!r} ({ep.value}) is not callable")
            self.register(ep.name, factory)
            added.append(ep.name)
        return tuple(added)

    def discover(self) -> tuple[str, ...]:
        """Register every factory installed under the entry-point group; return the names added."""
        return self.load_entry_points(metadata.entry_points(group=self.entry_point_group))


def build_plugin(what: str, build: Callable[[], Any], method: str, shape: str) -> Any:
    """`build()`, a factory's call, whose answer must have a callable `method`.

    Raises:
        ConfigError: the factory raised (a plugin's bug is a problem of the
            configuration naming it, not a crash) or answered something without
            `method`; `what` names it and `shape` says what was wanted.
    """
    try:
        built = build()
    except DuctorError:
        raise
    except (Exception, SystemExit) as exc:  # one that calls sys.exit() too
        raise ConfigError(f"{what} could not be built: {fault_text(exc)}") from exc
    if not callable(getattr(built, method, None)):
        raise ConfigError(f"{what}: its factory answered {type(built).__name__}, not {shape}")
    return built
