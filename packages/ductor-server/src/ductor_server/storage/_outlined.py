"""Large step outputs kept out of a run's state.

A tick rewrites its run's state whole. A step's output is fixed once the step
(or scatter item) has succeeded, so an output larger than `OUTLINE_BYTES` is
written once, to a `run_outputs` row of its own, and the state stored with the
run holds None in its place; `runs.outlined` lists such outputs as
`[step_ref, item_index]` pairs (-1 for a step's own output). Reading a run puts
them back, so no caller sees the difference. Without this, a run whose steps
each answer a few kilobytes (an AI step) would write the square of its length.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ductor_core.runs import RunState, StepState, StepStatus

OUTLINE_BYTES = 1024
"""An output whose JSON is longer than this is stored out of the state."""

Outlined = tuple[tuple[str, int], ...]
"""The outputs a run keeps out of its state: (step_ref, item_index) pairs."""

_encoder = msgspec.json.Encoder()


def _large(output: Any) -> bool:
    # Checked for every succeeded step at every tick: the common small cases
    # return before any encoding.
    if output is None or isinstance(output, bool | int | float) or not output:
        return False
    if isinstance(output, str):
        # A string's JSON is at least as long as the string.
        if len(output) > OUTLINE_BYTES:
            return True
        if len(output) * 6 + 2 <= OUTLINE_BYTES:
            return False
    return len(_encoder.encode(output)) > OUTLINE_BYTES


def outline(
    state: RunState, before: Outlined
) -> tuple[RunState, Outlined, list[tuple[str, int, Any]]]:
    """`state` as stored (outputs kept elsewhere set to None), every output kept
    elsewhere, and those of them not kept there before (to write now).

    An output kept before stays there while its step (or item) is still
    succeeded; one that is no longer (a step that can succeed again) leaves the
    list, and is written anew if it is large when it next succeeds."""
    earlier = set(before)
    keys: list[tuple[str, int]] = []
    fresh: list[tuple[str, int, Any]] = []

    def kept(key: tuple[str, int], output: Any) -> bool:
        if key in earlier:
            keys.append(key)
            return True
        if _large(output):
            keys.append(key)
            fresh.append((key[0], key[1], output))
            return True
        return False

    changed: dict[str, StepState] = {}
    for ref, step in state.steps.items():
        stripped = step
        succeeded = step.status is StepStatus.SUCCEEDED and step.output is not None
        if succeeded and kept((ref, -1), step.output):
            stripped = msgspec.structs.replace(stripped, output=None)
        if step.items:
            items = list(step.items)
            for at, item in enumerate(items):
                if item.status is not StepStatus.SUCCEEDED or item.output is None:
                    continue
                if kept((ref, item.index), item.output):
                    items[at] = msgspec.structs.replace(item, output=None)
            if any(new is not old for new, old in zip(items, step.items, strict=True)):
                stripped = msgspec.structs.replace(stripped, items=items)
        if stripped is not step:
            changed[ref] = stripped
    if changed:
        state = msgspec.structs.replace(state, steps={**state.steps, **changed})
    return state, tuple(keys), fresh


def splice(state: RunState, outputs: dict[tuple[str, int], Any]) -> RunState:
    """`state` with the outputs kept elsewhere back in place."""
    changed: dict[str, StepState] = {}
    for (ref, index), output in outputs.items():
        step = changed.get(ref) or state.steps.get(ref)
        if step is None:
            continue
        if index < 0:
            changed[ref] = msgspec.structs.replace(step, output=output)
        elif step.items:
            changed[ref] = msgspec.structs.replace(
                step,
                items=[
                    msgspec.structs.replace(item, output=output) if item.index == index else item
                    for item in step.items
                ],
            )
    if not changed:
        return state
    return msgspec.structs.replace(state, steps={**state.steps, **changed})


__all__ = ["OUTLINE_BYTES", "Outlined", "outline", "splice"]
