"""How `ductor apply` and `serve --seed` print a plan: one line per resource, one line
per problem, and a summary."""

from __future__ import annotations

from collections.abc import Sequence

from ductor_server.manifests.files import Problem
from ductor_server.manifests.plan import Action, Change, Plan

_DONE = {Action.CREATE: "created", Action.UPDATE: "updated", Action.UNCHANGED: "unchanged"}


def change_lines(plan: Plan, *, applied: bool) -> list[str]:
    """`create    Pool/sales` per resource (`created` once applied), in apply order."""
    lines = []
    for change in plan.changes:
        verb = _DONE[change.action] if applied else change.action.value
        extra = f" ({', '.join(change.fields)})" if change.fields else ""
        lines.append(f"{verb:<9} {change.resource.ref}{extra}")
    return lines


def problem_lines(problems: Sequence[Problem]) -> list[str]:
    """`error: FILE:LINE:COLUMN: POINTER: MESSAGE` per problem."""
    return [f"error: {problem}" for problem in problems]


def summary(plan: Plan, *, dry_run: bool) -> str:
    """One line: how many resources each action has, and whether anything changed."""
    counts = plan.counts()
    made, changed, same = counts[Action.CREATE], counts[Action.UPDATE], counts[Action.UNCHANGED]
    if dry_run:
        return f"dry run: {made} to create, {changed} to update, {same} unchanged; nothing changed"
    return f"applied: {made} created, {changed} updated, {same} unchanged"


def failure(problems: Sequence[Problem]) -> str:
    """The last line when there are problems."""
    return f"{len(problems)} problem(s): nothing was applied"


def partial(done: Sequence[Change], error: str) -> list[str]:
    """What to say when the server refused a change after others were made."""
    lines = [f"error: {error}"]
    if done:
        made = ", ".join(c.resource.ref for c in done)
        lines.append(f"applied before the error: {made}; apply again once it is fixed")
    return lines


__all__ = ["change_lines", "failure", "partial", "problem_lines", "summary"]
