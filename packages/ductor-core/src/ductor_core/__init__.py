"""Ductor's pure domain: definitions, validation, expressions and the tick. No I/O."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.definitions import (
    ARGS_BY_TYPE,
    ActionArgs,
    BridgeArgs,
    ConcurrencyOption,
    DataflowArgs,
    DefinitionStruct,
    Edge,
    EdgeType,
    GatherArgs,
    NotifyArgs,
    NotifyCta,
    NotifyEmail,
    RateLimit,
    RetryPolicy,
    RouteArgs,
    ScatterArgs,
    Step,
    StepArgs,
    StepTemplate,
    StepType,
    SubworkflowArgs,
    Trigger,
    WaitArgs,
    WaitForEventArgs,
    WaitForSignalArgs,
    WorkflowDefinition,
    WorkflowRef,
    canonical_json,
    content_hash,
    decode_args,
    decode_definition,
    definition_from_obj,
)
from ductor_core.durations import format_duration, parse_duration
from ductor_core.errors import DefinitionError, DuctorError, DurationError, ExpressionError
from ductor_core.expressions import (
    BoundVariables,
    CelRustEngine,
    CompiledExpression,
    ExpressionEngine,
    FunctionRegistry,
    default_engine,
    default_registry,
    engine_by_name,
    make_activation,
)
from ductor_core.graph import Graph
from ductor_core.runs import (
    AttemptResult,
    BufferedSignal,
    CancelChildRuns,
    CancelRequested,
    CancelTimer,
    ChildRunEnded,
    ClearWait,
    Command,
    DispatchTask,
    ErrorInfo,
    EventReceived,
    IgnoredInput,
    ItemState,
    RegisterWait,
    RunFinished,
    RunInput,
    RunState,
    RunStatus,
    SendNotifications,
    SetTimer,
    SignalReceived,
    StartChildRun,
    StepState,
    StepStatus,
    TickResult,
    TimerFired,
)
from ductor_core.step_specs import ArgsCheck, Evaluate, InCoordinator, OnWorker, StepSpec, StepSpecs
from ductor_core.tick import start_run, tick
from ductor_core.validation import (
    PROBLEM_CODES,
    Problem,
    ValidationReport,
    validate_definition,
    validate_definition_json,
)

if TYPE_CHECKING:
    from ductor_core.expressions import CelPyEngine

__version__ = "0.1.0"

__all__ = [
    # definitions
    "ARGS_BY_TYPE",
    # step types as specs
    "BUILTIN_STEP_SPECS",
    "PROBLEM_CODES",
    "ActionArgs",
    "ArgsCheck",
    # runs: inputs, commands, state
    "AttemptResult",
    # expressions
    "BoundVariables",
    "BridgeArgs",
    "BufferedSignal",
    "CancelChildRuns",
    "CancelRequested",
    "CancelTimer",
    "CelPyEngine",
    "CelRustEngine",
    "ChildRunEnded",
    "ClearWait",
    "Command",
    "CompiledExpression",
    "ConcurrencyOption",
    "DataflowArgs",
    # errors
    "DefinitionError",
    "DefinitionStruct",
    "DispatchTask",
    "DuctorError",
    "DurationError",
    "Edge",
    "EdgeType",
    "ErrorInfo",
    "Evaluate",
    "EventReceived",
    "ExpressionEngine",
    "ExpressionError",
    "FunctionRegistry",
    "GatherArgs",
    "Graph",
    "IgnoredInput",
    "InCoordinator",
    "ItemState",
    "NotifyArgs",
    "NotifyCta",
    "NotifyEmail",
    "OnWorker",
    "Problem",
    "RateLimit",
    "RegisterWait",
    "RetryPolicy",
    "RouteArgs",
    "RunFinished",
    "RunInput",
    "RunState",
    "RunStatus",
    "ScatterArgs",
    "SendNotifications",
    "SetTimer",
    "SignalReceived",
    "StartChildRun",
    "Step",
    "StepArgs",
    "StepSpec",
    "StepSpecs",
    "StepState",
    "StepStatus",
    "StepTemplate",
    "StepType",
    "SubworkflowArgs",
    "TickResult",
    "TimerFired",
    "Trigger",
    "ValidationReport",
    "WaitArgs",
    "WaitForEventArgs",
    "WaitForSignalArgs",
    "WorkflowDefinition",
    "WorkflowRef",
    "__version__",
    "canonical_json",
    "content_hash",
    "decode_args",
    "decode_definition",
    "default_engine",
    "default_registry",
    "definition_from_obj",
    "engine_by_name",
    "format_duration",
    "make_activation",
    "parse_duration",
    # tick
    "start_run",
    "tick",
    "validate_definition",
    "validate_definition_json",
]


def __getattr__(name: str) -> Any:
    # cel-python is loaded on first use (see `ductor_core.expressions`).
    if name == "CelPyEngine":
        from ductor_core.expressions import CelPyEngine

        return CelPyEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
