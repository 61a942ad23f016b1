"""A worker-run step type (`ductor.steps`): STEP_TYPE_EXAMPLE_SHOUT."""

from __future__ import annotations

from typing import Any

from ductor_core.step_args import DefinitionStruct
from ductor_core.step_specs import OnWorker, StepSpec
from ductor_server.engine.actions import ActionCall, failure
from ductor_server.extensions import StepExtension


class ShoutArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The step's args: `text` is CEL; `times` how often to say it."""

    text: str
    times: int = 1


async def shout(call: ActionCall) -> Any:
    """The handler: the evaluated `text` in upper case, `times` times."""
    text = call.payload["text"]
    if not isinstance(text, str):
        raise failure("example.not_text", "text must evaluate to a string", retryable=False)
    return {"shouted": " ".join([text.upper()] * call.payload["times"])}


SHOUT = StepExtension(
    spec=StepSpec(
        type="STEP_TYPE_EXAMPLE_SHOUT",
        args=ShoutArgs,
        start=OnWorker(handler="example_shout"),
        expressions=("text",),
    ),
    handler=shout,
)
