"""The routable-kind validators plugins add (`ductor.kinds`), applied to every routable
of their kind before it is routed.

A validator returns every problem at once, each a JSON pointer into the routable;
the routing service refuses a routable with problems (`routing.routable_invalid`,
nothing stored). A validator that raises refuses the routable too (its kind
cannot be checked) and is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ductor_routing.kinds import Problem
from ductor_routing.routables import Routable
from ductor_server.extensions.points import KindValidator

_log = logging.getLogger("ductor.extensions.kinds")


class KindValidators:
    """Validators by routable kind (at most one per kind)."""

    def __init__(self, validators: Mapping[str, KindValidator] | None = None) -> None:
        self._validators = dict(validators or {})

    def __contains__(self, kind: object) -> bool:
        return kind in self._validators

    def problems(self, routable: Routable) -> tuple[Problem, ...]:
        """Every problem the validator of `routable.kind` finds (none without one)."""
        validator = self._validators.get(routable.kind)
        if validator is None:
            return ()
        try:
            found: tuple[Any, ...] = tuple(validator(routable))
        except (Exception, SystemExit) as exc:  # one that calls sys.exit() too
            _log.exception("the validator of routable kind %r failed", routable.kind)
            return (
                Problem(
                    pointer="/kind",
                    message=f"the validator of kind {routable.kind!r} failed: {_text(exc)}",
                ),
            )
        problems = []
        for problem in found:
            if not isinstance(problem, Problem):
                _log.error(
                    "the validator of routable kind %r returned %r, not a Problem",
                    routable.kind,
                    problem,
                )
                return (
                    Problem(
                        pointer="/kind",
                        message=f"the validator of kind {routable.kind!r} returned a non-Problem",
                    ),
                )
            problems.append(problem)
        return tuple(problems)


def _text(exc: BaseException) -> str:
    """`exc` as text, its type first; never raises (a plugin's exception may)."""
    try:
        text = str(exc)
    except Exception:
        text = "(its text could not be read)"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


__all__ = ["KindValidators"]
