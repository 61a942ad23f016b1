"""The one loading mechanism: every extension point's entry points, read from the
installed distributions' metadata, loaded, checked against their contract, and
reported (what loaded, from which distribution, and what failed and why).

A plugin that fails to import or does not keep its contract is logged, listed
as a failure and skipped; the server starts without it. Loading runs once per
process (`installed_extensions`) and never while serving a request.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import msgspec

from ductor_core.expressions import FunctionRegistry, default_registry
from ductor_server.extensions.points import (
    POINTS,
    POINTS_BY_GROUP,
    ExtensionContractError,
    ExtensionPoint,
)

_log = logging.getLogger("ductor.extensions")

LOAD_FAILED = "extension.load_failed"
"""The failure code of an entry point that could not be imported."""

DUPLICATE = "extension.duplicate"
"""The failure code of a second entry point of one name in one group."""


class LoadedExtension(msgspec.Struct, frozen=True, kw_only=True):
    """One extension that loaded.

    Attributes:
        name: the entry point's name (the strategy, function, kind, ... name).
        distribution: the installed distribution that publishes it.
        version: that distribution's version.
        object: the object path the entry point names (`module:attribute`).
    """

    name: str
    distribution: str | None
    version: str | None
    object: str


class ExtensionFailure(msgspec.Struct, frozen=True, kw_only=True):
    """One entry point that did not load, and why.

    Attributes:
        group: its extension point's entry-point group.
        name: the entry point's name.
        distribution: the distribution that publishes it.
        version: that distribution's version.
        object: the object path it names.
        code: `extension.load_failed` (the import raised), `extension.contract`
            (the object does not keep the point's contract) or `extension.duplicate`.
        error: what went wrong, in one line.
    """

    group: str
    name: str
    distribution: str | None
    version: str | None
    object: str
    code: str
    error: str


class PointView(msgspec.Struct, frozen=True, kw_only=True):
    """One extension point in the listing: its group, contract and loaded extensions."""

    group: str
    title: str
    contract: str
    extensions: tuple[LoadedExtension, ...]


class ExtensionsView(msgspec.Struct, frozen=True, kw_only=True):
    """`GET /v1/extensions`: every point with what loaded, and every failure."""

    points: tuple[PointView, ...]
    failures: tuple[ExtensionFailure, ...]


@dataclass(slots=True)
class Extensions:
    """The extensions of one process: per group, (what loaded, the checked value)."""

    loaded: dict[str, list[tuple[LoadedExtension, Any]]] = field(default_factory=dict)
    failures: list[ExtensionFailure] = field(default_factory=list)

    def values(self, group: str) -> list[tuple[LoadedExtension, Any]]:
        """The loaded extensions of `group` with their checked values, by name."""
        return list(self.loaded.get(group, ()))

    def view(self) -> ExtensionsView:
        """The listing of `GET /v1/extensions` and `ductor extensions list`."""
        return ExtensionsView(
            points=tuple(
                PointView(
                    group=point.group,
                    title=point.title,
                    contract=point.contract,
                    extensions=tuple(found for found, _ in self.values(point.group)),
                )
                for point in POINTS
            ),
            failures=tuple(self.failures),
        )


def one_line(exc: BaseException) -> str:
    """`exc` as one line of text, its type first; never raises."""
    try:
        text = " ".join(str(exc).split()) or type(exc).__name__
    except Exception:  # a plugin's exception whose text raises
        text = "(its text could not be read)"
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, ExtensionContractError) else text


def _load_one(
    point: ExtensionPoint, ep: metadata.EntryPoint, found: Extensions, seen: dict[str, str]
) -> None:
    dist = ep.dist
    entry = LoadedExtension(
        name=ep.name,
        distribution=dist.name if dist is not None else None,
        version=dist.version if dist is not None else None,
        object=ep.value,
    )

    def fail(code: str, error: str) -> None:
        failure = ExtensionFailure(
            group=point.group,
            name=entry.name,
            distribution=entry.distribution,
            version=entry.version,
            object=entry.object,
            code=code,
            error=error,
        )
        found.failures.append(failure)
        _log.error(
            "extension %s %r (%s %s, %s) skipped: %s",
            point.group,
            entry.name,
            entry.distribution,
            entry.version,
            entry.object,
            error,
        )

    if ep.name in seen:
        fail(DUPLICATE, f"{ep.name!r} is already provided by {seen[ep.name]}")
        return
    try:
        obj = ep.load()
    except (Exception, SystemExit) as exc:  # a module calling sys.exit() at import too
        fail(LOAD_FAILED, one_line(exc))
        return
    try:
        value = point.check(ep.name, obj)
    except ExtensionContractError as exc:
        fail(ExtensionContractError.code, one_line(exc))
        return
    except (Exception, SystemExit) as exc:
        # Reading the object raised (an attribute that raises, a factory that exits):
        # it does not keep the contract either.
        fail(ExtensionContractError.code, f"checking {ep.name!r} raised {one_line(exc)}")
        return
    seen[ep.name] = entry.distribution or entry.object
    found.loaded.setdefault(point.group, []).append((entry, value))


_SECTION = re.compile(r"^\[(?P<group>[^\]]*)\]$")


def _unreadable_manifest(dist: metadata.Distribution, exc: Exception) -> list[ExtensionFailure]:
    """A failure for each line in a ductor group of `dist`'s `entry_points.txt`,
    which does not parse (`exc`): none of them can be trusted to load."""
    try:
        name, version = dist.metadata["Name"], dist.metadata["Version"]
        text = dist.read_text("entry_points.txt") or ""
    except Exception as unreadable:
        _log.warning(
            "ignoring a distribution whose metadata cannot be read: %s", one_line(unreadable)
        )
        return []
    error = f"the entry_points.txt of {name} does not parse: {one_line(exc)}"
    failures = []
    group = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        section = _SECTION.match(line)
        if section is not None:
            group = section.group("group").strip()
            continue
        if group not in POINTS_BY_GROUP:
            continue
        ep_name, _, value = line.partition("=")
        failures.append(
            ExtensionFailure(
                group=group,
                name=ep_name.strip(),
                distribution=name,
                version=version,
                object=value.strip(),
                code=LOAD_FAILED,
                error=error,
            )
        )
    if not failures:
        _log.warning("ignoring the entry points of %s %s: %s", name, version, error)
    return failures


def _installed_entry_points(
    found: Extensions, wanted: frozenset[str] | None
) -> metadata.EntryPoints:
    """The installed distributions' entry points, as `importlib.metadata.entry_points()`
    reads them, except that a distribution whose `entry_points.txt` does not parse
    is a failure in `found` (each of its lines in a `wanted` group), not the end of
    loading."""
    try:
        every = metadata.entry_points()
        return metadata.EntryPoints(
            ep for group in POINTS_BY_GROUP for ep in every.select(group=group)
        )
    except Exception:  # a distribution's manifest does not parse: read them one by one
        pass
    eps: list[metadata.EntryPoint] = []
    seen: set[str] = set()
    for dist in metadata.distributions():
        try:
            # The first distribution of a name on the path, as entry_points() takes it.
            normal = getattr(dist, "_normalized_name", None) or dist.metadata["Name"] or ""
            if normal in seen:
                continue
            seen.add(normal)
            eps.extend(dist.entry_points)
        except Exception as exc:
            for failure in _unreadable_manifest(dist, exc):
                if wanted is not None and failure.group not in wanted:
                    continue
                found.failures.append(failure)
                _log.error(
                    "extension %s %r (%s %s, %s) skipped: %s",
                    failure.group,
                    failure.name,
                    failure.distribution,
                    failure.version,
                    failure.object,
                    failure.error,
                )
    return metadata.EntryPoints(eps)


def load_extensions(
    entry_points: Iterable[metadata.EntryPoint] | None = None,
    *,
    groups: Iterable[str] | None = None,
) -> Extensions:
    """Load every extension point's entry points (all installed ones if None), or only
    those of `groups`.

    Never raises for a plugin's fault: each failure is logged and listed.
    """
    given = None if entry_points is None else list(entry_points)
    found = Extensions()
    wanted = None if groups is None else frozenset(groups)
    # One scan of the installed distributions serves every group (a scan per group
    # cost about 15 ms each at every start).
    installed = (
        _installed_entry_points(found, wanted) if given is None else metadata.EntryPoints(())
    )
    for point in POINTS:
        if wanted is not None and point.group not in wanted:
            continue
        seen: dict[str, str] = {}
        eps = installed.select(group=point.group) if given is None else given
        mine = sorted(
            (ep for ep in eps if ep.group == point.group),
            key=lambda ep: (ep.name, ep.dist.name if ep.dist is not None else ""),
        )
        for ep in mine:
            _load_one(point, ep, found, seen)
        found.loaded.setdefault(point.group, [])
    return found


_installed: Extensions | None = None
_installed_lock = threading.Lock()


def is_installed(extensions: Extensions) -> bool:
    """Whether `extensions` is this process's `installed_extensions()` (loading nothing)."""
    return extensions is _installed


def installed_extensions() -> Extensions:
    """The installed extensions, loaded on first use and shared by the process."""
    global _installed
    with _installed_lock:
        if _installed is None:
            _installed = load_extensions()
        return _installed


CEL_FUNCTIONS = "ductor.cel.functions"


def register_cel_functions(
    extensions: Extensions, registry: FunctionRegistry | None = None
) -> tuple[str, ...]:
    """Register the loaded CEL functions in `registry` (the process-wide default
    registry, which the server's engines are built from, if None); names already
    there are left as they are. The names registered."""
    target = registry if registry is not None else default_registry()
    added = []
    for entry, impl in extensions.values(CEL_FUNCTIONS):
        if entry.name in target:
            continue
        doc = (getattr(impl, "__doc__", None) or "").strip().splitlines()
        target.register(entry.name, impl, doc=doc[0] if doc else "")
        added.append(entry.name)
    return tuple(added)


def install_cel_functions() -> tuple[str, ...]:
    """Register the installed plugins' CEL functions in the default registry: what
    every process that builds an engine (the server, its sandbox children and its
    lanes' worker processes) calls before building it. Loads only that group
    unless the process loaded every extension already."""
    with _installed_lock:
        found = _installed
    if found is None:
        found = load_extensions(groups=(CEL_FUNCTIONS,))
    return register_cel_functions(found)


__all__ = [
    "CEL_FUNCTIONS",
    "DUPLICATE",
    "LOAD_FAILED",
    "POINTS_BY_GROUP",
    "ExtensionFailure",
    "Extensions",
    "ExtensionsView",
    "LoadedExtension",
    "PointView",
    "install_cel_functions",
    "installed_extensions",
    "is_installed",
    "load_extensions",
    "register_cel_functions",
]
