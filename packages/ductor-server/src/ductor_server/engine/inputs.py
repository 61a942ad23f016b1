"""Checking a new DAG run's input against its version's `input_schema`
(`ductor_core.input_schemas`) before anything of the run is written.

A small input is checked on the loop with a few steps (`QUICK_STEPS`), then
the loop is given a turn (a batch or an event's triggers check many inputs one
after another); any other, or one that needs more steps, in the engine lane on
the tenant's turn. Nothing here opens a transaction or writes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ductor_core.definitions import WorkflowDefinition
from ductor_core.input_schemas import InputCheck, check_input
from ductor_server.engine.cheap import small
from ductor_server.engine.offload import ENGINE
from ductor_server.errors import RunInputInvalid

QUICK_STEPS = 1_000
"""The most steps a check may take on the event loop (about 20 ms at worst, for a
schema that makes each of a 4 KiB input's values cost uncounted work); a check
that needs more runs again in the engine lane."""


async def input_check(definition: WorkflowDefinition, input: Any, *, tenant_id: str) -> InputCheck:
    """What checking `input` against `definition.input_schema` finds (valid
    without a schema)."""
    schema = definition.input_schema
    if schema is None:
        return InputCheck()
    if small([input]):
        found = check_input(schema, input, steps=QUICK_STEPS)
        await asyncio.sleep(0)
        if found.complete:
            return found
    return await ENGINE.run_for(tenant_id, check_input, schema, input)


def refusal(definition: WorkflowDefinition, found: InputCheck) -> RunInputInvalid:
    """The error refusing a run whose input check found `found`."""
    problems = [{"pointer": p.pointer, "message": p.message} for p in found.problems]
    return RunInputInvalid(definition.family_slug, problems)


async def refuse_bad_input(definition: WorkflowDefinition, input: Any, *, tenant_id: str) -> None:
    """Raise `RunInputInvalid` unless `input` satisfies `definition.input_schema`."""
    found = await input_check(definition, input, tenant_id=tenant_id)
    if not found.valid:
        raise refusal(definition, found)


__all__ = ["QUICK_STEPS", "input_check", "refusal", "refuse_bad_input"]
