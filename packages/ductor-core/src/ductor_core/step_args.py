"""The structs a step's args are made of: the built-in step types' wire names and
args, the retry policy, and the base an args struct derives from. Data only.

What each type means and how it is checked and run is its spec (`builtin_steps`).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

import msgspec


class StepType(enum.StrEnum):
    """What a step does; wire names in protobuf enum style."""

    DATAFLOW = "STEP_TYPE_DATAFLOW"
    WAIT = "STEP_TYPE_WAIT"
    WAIT_FOR_EVENT = "STEP_TYPE_WAIT_FOR_EVENT"
    WAIT_FOR_SIGNAL = "STEP_TYPE_WAIT_FOR_SIGNAL"
    ACTION = "STEP_TYPE_ACTION"
    SCATTER = "STEP_TYPE_SCATTER"
    GATHER = "STEP_TYPE_GATHER"
    SUBWORKFLOW = "STEP_TYPE_SUBWORKFLOW"
    BRIDGE = "STEP_TYPE_BRIDGE"
    ROUTE = "STEP_TYPE_ROUTE"
    NOTIFY = "STEP_TYPE_NOTIFY"


class DefinitionStruct(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of args structs, a new step type's included: frozen, keyword-only,
    unknown fields rejected (so validation and decoding agree)."""


class RetryPolicy(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-step retry: attempts in all (1 = no retry), exponential backoff with a cap."""

    max_attempts: int = 3
    initial_interval: str = "1s"
    backoff_coefficient: float = 2.0
    max_interval: str = "5m"
    non_retryable_codes: list[str] = []


# --- typed args, one struct per built-in step type ------------------------------


class DataflowArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Deterministic transform evaluated in the coordinator.

    - project: `project` maps output keys to expressions;
    - filter: keep the elements of `items` for which `predicate` (over `item`) holds;
    - map: `expression` (over `item`, `index`) applied to each element of `items`;
    - merge: the maps that `sources` evaluate to, merged left to right;
    - pick: the `keys` of the map that `source` evaluates to.
    """

    operation: Literal["project", "filter", "map", "merge", "pick"]
    project: dict[str, str] | None = None
    items: str | None = None
    predicate: str | None = None
    expression: str | None = None
    sources: list[str] | None = None
    source: str | None = None
    keys: list[str] | None = None


class WaitArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A durable delay: exactly one of `duration` ("2s") or `until` (CEL timestamp)."""

    duration: str | None = None
    until: str | None = None


class WaitForEventArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Wait for an event named `event` whose `match` (CEL over `event`, `input`, `steps`) holds."""

    event: str
    match: str | None = None
    timeout: str | None = None


class WaitForSignalArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Wait for the signal `signal` sent to this run."""

    signal: str
    timeout: str | None = None


class ActionArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Dispatch work to a worker, in one of two forms:

    - through a connection: `connection` names one of the tenant's connections,
      `operation` one of its provider's operations, and `input` maps the
      operation's input fields to CEL;
    - a built-in action: `action` names it (`http`, `noop`) and `params` maps
      its parameters to CEL.

    The coordinator evaluates the CEL, so workers receive plain values.
    """

    action: str | None = None
    params: dict[str, str] = {}
    connection: str | None = None
    operation: str | None = None
    input: dict[str, str] = {}


class StepTemplate(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The step a SCATTER runs once per item (its expressions also see `item`, `index`)."""

    type: str
    args: dict[str, Any] = {}
    retry: RetryPolicy | None = None
    timeout: str | None = None


class WorkflowRef(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A published workflow family, at `version` or the latest."""

    family_slug: str
    version: int | None = None


class ScatterArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Fan out `step` or `workflow` once per element of `items`, at most
    `max_concurrency` at a time. Output: the per-item results in item order."""

    items: str
    step: StepTemplate | None = None
    workflow: WorkflowRef | None = None
    input: str | None = None
    max_concurrency: int = 10
    tolerate_failures: bool = False


class GatherArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Collect a SCATTER's results in item order: `{items, succeeded, failed}`."""

    scatter: str


class SubworkflowArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Start a child run of `family_slug` (at `version`, else latest) with `input` (CEL)."""

    family_slug: str
    version: int | None = None
    input: str | None = None


class BridgeArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Drive a workflow hosted by an SDK app through the bridge protocol."""

    app_id: str
    workflow: str
    input: str | None = None


class RouteArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Route a routable built from CEL; optionally wait for the assignee to complete it."""

    kind: str
    attributes: dict[str, str] = {}
    pool: str | None = None
    price: str | None = None
    await_completion: bool = False
    timeout: str | None = None


class NotifyCta(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A call to action on a notification: a link (`url`, CEL) or an `action` (a
    name) whose click is sent back to the run; `label` is CEL. The url must come
    out an absolute http(s) URL and the label 1-200 printable characters
    (`ductor_core.notification_fields`), else the step fails (`notify.bad_value`).

    A clicked action resumes the NOTIFY step when it has `await_action`, and also
    sends the signal `signal` to the run or the event `event` when they are named.
    """

    label: str
    url: str | None = None
    action: str | None = None
    signal: str | None = None
    event: str | None = None


class NotifyEmail(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Email for the recipients whose preferences allow it, through the tenant's
    SMTP connection `connection`; `subject` is CEL (the title if not given)."""

    connection: str
    subject: str | None = None


class NotifyArgs(DefinitionStruct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Create an inbox notification for each recipient, in the coordinator's commit.

    `recipients` (CEL: a subscriber id or a list of them), `title`, `body`, `data`
    (a map) and `avatar` (an absolute http(s) URL, as a CTA's `url`) are CEL;
    `feed` is a name. With `await_action` the step waits (a durable wait) until
    a recipient clicks an action CTA, or `timeout`.
    """

    recipients: str
    title: str
    body: str = '""'
    data: str | None = None
    feed: str = "default"
    avatar: str | None = None
    ctas: list[NotifyCta] = []
    await_action: bool = False
    timeout: str | None = None
    email: NotifyEmail | None = None
