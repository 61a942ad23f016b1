"""Run state, the inputs a tick consumes and the commands it produces.

These are the contract between the pure `tick` and the server that persists
state and carries out commands. Everything here is plain data (msgspec
Structs, tagged unions), encodable to JSON for storage and the API.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import msgspec


class RunStatus(enum.StrEnum):
    """Where a run is in its life."""

    PENDING = "RUN_STATUS_PENDING"
    RUNNING = "RUN_STATUS_RUNNING"
    SUCCEEDED = "RUN_STATUS_SUCCEEDED"
    FAILED = "RUN_STATUS_FAILED"
    CANCELLED = "RUN_STATUS_CANCELLED"

    @property
    def terminal(self) -> bool:
        """True once the run can change no more."""
        return self in _RUN_ENDED


class StepStatus(enum.StrEnum):
    """Where a step is in its life."""

    PENDING = "STEP_STATUS_PENDING"  # not all incoming edges decided yet
    RUNNING = "STEP_STATUS_RUNNING"  # dispatched, attempt in flight
    RETRYING = "STEP_STATUS_RETRYING"  # failed an attempt, backoff timer set
    WAITING = "STEP_STATUS_WAITING"  # timer, event, signal or child run
    SUCCEEDED = "STEP_STATUS_SUCCEEDED"
    FAILED = "STEP_STATUS_FAILED"  # retries spent (or non-retryable)
    SKIPPED = "STEP_STATUS_SKIPPED"  # no incoming edge taken
    CANCELLED = "STEP_STATUS_CANCELLED"

    @property
    def terminal(self) -> bool:
        """True once the step's outcome is decided."""
        return self in _STEP_DECIDED


# Asked on every tick, many times: a set looks a member up faster than a tuple of
# the class's attributes.
_RUN_ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
_STEP_DECIDED = frozenset(
    {StepStatus.SUCCEEDED, StepStatus.FAILED, StepStatus.SKIPPED, StepStatus.CANCELLED}
)


class _Data(msgspec.Struct, frozen=True, kw_only=True):
    pass


class ErrorInfo(_Data, frozen=True, kw_only=True):
    """A failure as data: stable code, message, and whether a retry may help."""

    code: str
    message: str
    retryable: bool = True
    retry_after_seconds: float | None = None
    details: Any = None


class ItemState(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """One item of a SCATTER (item_index >= 0)."""

    index: int
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0
    output: Any = None
    error: ErrorInfo | None = None
    child_run_id: str | None = None


class StepState(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """The state of one step of a run."""

    ref: str
    status: StepStatus = StepStatus.PENDING
    attempt: int = 0  # attempt number in flight or last finished (1-based)
    output: Any = None
    error: ErrorInfo | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    retry_at: datetime | None = None
    waiting_for: str | None = None  # human-readable: "timer", "event order.shipped", ...
    child_run_id: str | None = None
    items: list[ItemState] | None = None  # SCATTER only
    data: dict[str, Any] = {}  # step-type private bookkeeping


class BufferedSignal(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """A signal received while no step was waiting for it (kept until one does)."""

    signal_id: str
    name: str
    payload: Any = None


class RunState(_Data, frozen=True, kw_only=True, omit_defaults=True):
    """Everything the coordinator needs to tick a run; persisted as one value."""

    run_id: str
    status: RunStatus
    input: Any = None
    steps: dict[str, StepState] = {}
    output: Any = None
    error: ErrorInfo | None = None
    created_at: datetime
    finished_at: datetime | None = None
    cancel_requested: bool = False
    # Added for the tick (all optional, with defaults):
    # timers the tick set and that have neither fired nor been cancelled, id -> fire_at;
    timers: dict[str, datetime] = {}
    # signals that arrived before any step waited for them (consumed in arrival order);
    pending_signals: list[BufferedSignal] = []
    # ids of events and signals already applied or buffered ("event:<id>", "signal:<id>"),
    # so that a redelivery is ignored instead of applied twice;
    received_ids: list[str] = []
    # how many steps are not terminal yet; None means "count them".
    open_steps: int | None = None

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        """Pickled as its JSON, the form it is stored in.

        A tick computed in another process sends the run's state there and
        back. Pickle rebuilds a Struct field by field: for a state of 10,000
        scatter items, about 10 ms each way on the sending process's event
        loop, against about 1 ms to encode and 4 ms to decode as JSON.
        """
        return (_state_from_json, (_json_encoder.encode(self),))


_json_encoder = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(RunState)


def _state_from_json(data: bytes) -> RunState:
    """A `RunState` from the JSON `RunState.__reduce__` gave."""
    return _state_decoder.decode(data)


# --- inputs ------------------------------------------------------------------


class AttemptResult(_Data, frozen=True, kw_only=True, tag="attempt_result"):
    """A worker finished an attempt. `ok` with `output`, or `error`."""

    step_ref: str
    item_index: int = -1
    attempt: int
    ok: bool
    output: Any = None
    error: ErrorInfo | None = None


class TimerFired(_Data, frozen=True, kw_only=True, tag="timer_fired"):
    """A timer the tick set has come due."""

    timer_id: str


class EventReceived(_Data, frozen=True, kw_only=True, tag="event_received"):
    """An event whose name some WAIT_FOR_EVENT step of this run waits on; the
    tick checks each waiting step's `match`."""

    event_id: str
    name: str
    data: Any = None


class SignalReceived(_Data, frozen=True, kw_only=True, tag="signal_received"):
    """A signal sent to the run."""

    signal_id: str
    name: str
    payload: Any = None


class ChildRunEnded(_Data, frozen=True, kw_only=True, tag="child_run_ended"):
    """A child run (SUBWORKFLOW or SCATTER of workflows) ended."""

    step_ref: str
    item_index: int = -1
    child_run_id: str
    status: RunStatus
    output: Any = None
    error: ErrorInfo | None = None


class CancelRequested(_Data, frozen=True, kw_only=True, tag="cancel_requested"):
    """Cancel the run (and its children)."""

    reason: str = ""


RunInput = (
    AttemptResult | TimerFired | EventReceived | SignalReceived | ChildRunEnded | CancelRequested
)


# --- commands ------------------------------------------------------------------


class DispatchTask(_Data, frozen=True, kw_only=True, tag="dispatch_task"):
    """Enqueue work for a step worker. `payload` holds resolved values, no CEL."""

    step_ref: str
    item_index: int = -1
    attempt: int
    step_type: str
    handler: str  # "action:http", "bridge", "route"
    payload: Any = None
    idempotency_key: str
    timeout_seconds: float | None = None


class SetTimer(_Data, frozen=True, kw_only=True, tag="set_timer"):
    """Fire `TimerFired(timer_id)` at `fire_at`. Setting an existing id replaces it."""

    timer_id: str
    fire_at: datetime


class CancelTimer(_Data, frozen=True, kw_only=True, tag="cancel_timer"):
    """Forget a timer that has not fired."""

    timer_id: str


class RegisterWait(_Data, frozen=True, kw_only=True, tag="register_wait"):
    """Deliver events (kind "event") or signals (kind "signal") named `name` to this run."""

    step_ref: str
    kind: str
    name: str


class ClearWait(_Data, frozen=True, kw_only=True, tag="clear_wait"):
    """Stop delivering for a wait registered by `step_ref`."""

    step_ref: str


class StartChildRun(_Data, frozen=True, kw_only=True, tag="start_child_run"):
    """Start a child run; `child_key` is unique per parent run and makes the start idempotent."""

    step_ref: str
    item_index: int = -1
    child_key: str
    family_slug: str
    version: int | None = None
    input: Any = None


class CancelChildRuns(_Data, frozen=True, kw_only=True, tag="cancel_child_runs"):
    """Cancel every live child run this run started (or those of `step_ref`)."""

    step_ref: str | None = None


class SendNotifications(_Data, frozen=True, kw_only=True, tag="send_notifications"):
    """Create one inbox notification per recipient (a NOTIFY step). `group_id`
    (`{run_id}:{step_ref}`) names the set: it makes the send idempotent and an
    action clicked on any of them resumes the step once. Values are resolved."""

    step_ref: str
    group_id: str
    recipients: list[str]
    feed: str
    title: str
    body: str = ""
    data: Any = None
    avatar: str | None = None
    ctas: list[dict[str, Any]] = []
    await_action: bool = False
    email: dict[str, Any] | None = None


class RunFinished(_Data, frozen=True, kw_only=True, tag="run_finished"):
    """The run reached a terminal status; the parent (if any) must be told."""

    status: RunStatus
    output: Any = None
    error: ErrorInfo | None = None


Command = (
    DispatchTask
    | SetTimer
    | CancelTimer
    | RegisterWait
    | ClearWait
    | StartChildRun
    | CancelChildRuns
    | SendNotifications
    | RunFinished
)


class IgnoredInput(_Data, frozen=True, kw_only=True):
    """An input the tick did not apply, and why (duplicate, stale attempt, unknown step...)."""

    input: RunInput
    reason: str


class TickResult(_Data, frozen=True, kw_only=True):
    """The new state and the commands to commit with it, atomically."""

    state: RunState
    commands: list[Command] = []
    ignored: list[IgnoredInput] = []
