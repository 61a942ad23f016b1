"""The ACTION steps of a definition as sent (raw JSON, before it is decoded), for
the checks only the server can make: the actions its handlers serve, the
tenant's connections."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from ductor_core.definitions import StepType


class ActionStep(NamedTuple):
    """One ACTION step: where it is and its args."""

    pointer: str  # the step: "/steps/2", or "/steps/2/args/step" for a SCATTER's template
    name: str  # how a message names it: "step 'fetch'" (or "steps[2]" without a ref)
    prefix: str  # its args' path in that message: "" or "args.step."
    args: Mapping[str, Any]


def action_steps(definition: Any) -> Iterator[ActionStep]:
    """Every ACTION step of `definition` with args, SCATTER templates included;
    anything malformed is skipped (validation reports it)."""
    steps = definition.get("steps") if isinstance(definition, Mapping) else None
    if not isinstance(steps, list):
        return
    for index, step in enumerate(steps):
        ref = step.get("ref") if isinstance(step, Mapping) else None
        name = f"step '{ref}'" if isinstance(ref, str) else f"steps[{index}]"
        at, prefix = f"/steps/{index}", ""
        while isinstance(step, Mapping) and isinstance(args := step.get("args"), Mapping):
            if step.get("type") == StepType.ACTION:
                yield ActionStep(at, name, prefix, args)
                break
            if step.get("type") != StepType.SCATTER:
                break
            step, at, prefix = args.get("step"), at + "/args/step", prefix + "args.step."


__all__ = ["ActionStep", "action_steps"]
