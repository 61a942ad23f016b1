"""The pure tick: a run's state and its new inputs in, the next state and commands out.

Deterministic and free of I/O: no clock (`now` is passed in), no randomness
(retry jitter is a hash of the attempt's identity), no store, no queue.

How a step starts comes from its type's spec (`step_specs`, passed in as
`specs`): a worker-run type becomes a DispatchTask with the spec's handler
name and payload; the other types name one of the coordinator behaviours
(`InCoordinator`) implemented here. No step type is named in this module.

Semantics the server and users rely on (see also DESIGN.md, "Definitions"):

- Edges are decided when their source is terminal: SUCCESS is taken if the
  source SUCCEEDED, FAILURE if it FAILED, ALWAYS if either, CONDITION if it
  SUCCEEDED and the condition (CEL, with `output` = the source's output) is
  true; a condition that fails to evaluate counts as not taken and is noted in
  the target's `data["condition_errors"]`. A step starts once every incoming
  edge is decided and at least one was taken; otherwise it is SKIPPED, and a
  skipped step takes none of its own edges (dead-path elimination).
- Fail fast: a step that FAILS with no FAILURE or ALWAYS edge leaving it fails
  the run at once. Everything still in flight is cancelled: non-terminal steps
  become CANCELLED, every live timer gets a CancelTimer, every wait a
  ClearWait, and child runs a CancelChildRuns. Results that arrive later are
  ignored. (Temporal-style: a doomed run never lingers behind a long wait.)
- A run SUCCEEDS when every step is terminal and no failure was unhandled. Its
  output is `definition.output` evaluated, or by default `{ref: output}` for
  every sink (step with no outgoing edge) that SUCCEEDED, null outputs
  included. A WAIT's output is `{"waited_until": <iso>}`, so hello-world ends
  with `{"pause": {"waited_until": ...}}`.
- WAIT_FOR_EVENT / WAIT_FOR_SIGNAL that time out SUCCEED with output null
  (like Inngest's waitForEvent returning null): a handler tells "no event" by
  testing the output, and the run goes on. An event whose `match` fails to
  evaluate does not match (reported in `ignored`); an event that arrives
  before the step waits is not seen (as in Inngest). One event may satisfy every
  step waiting for it; a signal goes to one waiting step (document order) and
  is buffered in `RunState.pending_signals` while no step waits for it yet (a
  signal no step of the workflow ever waits for is ignored; one is kept per step
  of its name yet to start, within `MAX_KEPT_SIGNAL_BYTES`). Event and signal
  ids are remembered, so a redelivery is ignored.
- Worker steps retry per `step.retry` (default 3 attempts, 1s, x2, at most 5m,
  jittered by +-10%); `step.timeout` bounds each attempt and counts as a
  retryable error `step.timeout`. On SUBWORKFLOW, `timeout` bounds the child
  run: the step fails (not retried) and the child is cancelled. On the waits,
  the args' `timeout` wins and the step's `timeout` is the fallback. An error's
  `retry_after_seconds` replaces the backoff as is.
- SCATTER evaluates `items` once, when it starts (kept in `data["values"]`;
  more than `MAX_SCATTER_ITEMS` fail the step, `scatter.too_many_items`),
  runs at most `max_concurrency` items at a time, and ends when every item
  has: SUCCEEDED with the outputs in item order, or FAILED (error
  `scatter.items_failed`, details `{"failed": [indexes]}`) unless
  `tolerate_failures`, where a failed item gives null. The template's `retry`
  and `timeout` apply per item; a `timeout` on the SCATTER step itself is not
  used.
- Expressions see `input`, `steps` (`{ref: {"output", "status"}}` of finished
  steps), `run` (`{"id", "now"}`), plus `item`/`index`, `event` or `output`
  where they apply. Evaluating one that fails makes the step FAILED with the
  expression error's code, not retryable.

Naming conventions (the server keys storage on these):
- task idempotency key: `{run_id}:{step_ref}:{item_index}:{attempt}`;
- timer id: `{step_ref}:{item_index}:{purpose}:{attempt}`, purpose in wait,
  retry, timeout, event_timeout, signal_timeout; for `retry` the attempt is
  the one the timer will dispatch;
- child key: `{run_id}:{step_ref}:{item_index}`.
item_index is -1 outside a SCATTER; attempts are 1-based.

For the server: a CancelTimer may name a timer that has just fired (its
TimerFired was in the same batch, behind an input that ended the run) and a
ClearWait always names a wait registered before; both are safe as no-ops when
the thing is already gone. `RunState.timers` is the tick's own list of live
timers and must agree with the server's timer table after every commit.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from msgspec.structs import replace

from ductor_core._dataflow import run_dataflow
from ductor_core._retry import DEFAULT_RETRY, backoff_delay, may_retry
from ductor_core._step_index import DefinitionIndex, IndexedEdge, StepIndex, index_for
from ductor_core.builtin_steps import BUILTIN_STEP_SPECS
from ductor_core.definitions import (
    DataflowArgs,
    EdgeType,
    GatherArgs,
    NotifyArgs,
    RetryPolicy,
    ScatterArgs,
    SubworkflowArgs,
    WaitArgs,
    WaitForEventArgs,
    WaitForSignalArgs,
    WorkflowDefinition,
)
from ductor_core.durations import parse_duration
from ductor_core.errors import DuctorError
from ductor_core.expressions import ExpressionEngine, default_engine
from ductor_core.notification_fields import (
    DATA_RULE,
    LABEL_RULE,
    SUBSCRIBER_ID_RULE,
    TEXT_RULE,
    URL_RULE,
    is_data,
    is_label,
    is_link,
    is_subscriber_id,
    is_text,
)
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
from ductor_core.step_specs import InCoordinator, OnWorker, StepSpec, StepSpecs
from ductor_core.timestamps import utc_text

__all__ = ["MAX_RECIPIENTS", "notify_signal", "start_run", "tick"]

_WAITS = (InCoordinator.WAIT_FOR_EVENT, InCoordinator.WAIT_FOR_SIGNAL)


def _parse_instant(value: Any, source: str) -> datetime:
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    raise DuctorError(
        f"`until` must give a timestamp, got {value!r} (in expression {source!r})",
        code="expression.evaluation",
    )


MAX_RECIPIENTS = 1000
"""The most subscribers one NOTIFY step may notify."""

MAX_KEPT_SIGNAL_BYTES = 1024 * 1024
"""The most JSON the payloads of a run's kept signals (sent before a step waits
for them) may hold in all. A run's state holds them and each tick rewrites it:
200 kept signals of 500 KB took the server to 2 GB of memory."""

_json = msgspec.json.Encoder()

MAX_SCATTER_ITEMS = 10_000
"""The most items one SCATTER step runs. A run's state holds every item, and each
tick rewrites it: a list of 50,000 took the engine over a minute and made every
other tenant's runs about ten times slower meanwhile."""


def notify_signal(ref: str) -> str:
    """The signal name a clicked action sends to resume NOTIFY step `ref`."""
    return f"inbox.action:{ref}"


def _recipients(value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise DuctorError(
            "NOTIFY recipients must evaluate to a subscriber id or a non-empty list of them",
            code="notify.bad_recipients",
        )
    seen: dict[str, None] = {}
    for item in items:
        if not isinstance(item, str) or not is_subscriber_id(item):
            raise DuctorError(
                f"each NOTIFY recipient is a subscriber id, a string that {SUBSCRIBER_ID_RULE},"
                f" got {item!r:.80}",
                code="notify.bad_recipients",
            )
        seen[item] = None
    if len(seen) > MAX_RECIPIENTS:
        raise DuctorError(
            f"a NOTIFY step notifies at most {MAX_RECIPIENTS} recipients, got {len(seen)}",
            code="notify.bad_recipients",
        )
    return list(seen)


def _error_of(exc: DuctorError) -> ErrorInfo:
    """A DuctorError raised while running a step, as a non-retryable step error."""
    return ErrorInfo(code=exc.code, message=exc.message, retryable=False, details=exc.details)


def _key(ref: str, index: int, purpose: str, attempt: int) -> str:
    return f"{ref}:{index}:{purpose}:{attempt}"


class _Tick:
    """One tick in progress: a mutable working copy of the run plus the commands so far."""

    def __init__(
        self, index: DefinitionIndex, state: RunState, now: datetime, engine: ExpressionEngine
    ) -> None:
        self.ix = index
        self.state = state
        self.run_id = state.run_id
        self.now = now
        self._now_iso: str | None = None
        self.engine = engine
        self.steps: dict[str, StepState] = dict(state.steps)
        if len(self.steps) != len(index.order):  # a state made by hand may omit steps
            for ref in index.order:
                if ref not in self.steps:
                    self.steps[ref] = StepState(ref=ref)
        self.timers: dict[str, datetime] = dict(state.timers)
        self.pending_signals: list[BufferedSignal] = list(state.pending_signals)
        self.received_ids: list[str] = list(state.received_ids)
        self._received: set[str] | None = None
        self.status = state.status
        self.output: Any = state.output
        self.error = state.error
        self.finished_at = state.finished_at
        self.cancel_requested = state.cancel_requested
        self.open = (
            state.open_steps
            if state.open_steps is not None and len(self.steps) == len(state.steps)
            else sum(1 for s in self.steps.values() if not s.status.terminal)
        )
        self.commands: list[Command] = []
        self.ignored: list[IgnoredInput] = []
        self.work: deque[str] = deque()
        self._view: dict[str, Any] | None = None
        self._filling: set[str] = set()  # scatters whose items are being launched
        self._own_items: set[str] = set()  # scatters whose items list this tick copied

    # --- result ------------------------------------------------------------------

    def result(self) -> TickResult:
        state = replace(
            self.state,
            status=self.status,
            steps=self.steps,
            output=self.output,
            error=self.error,
            finished_at=self.finished_at,
            cancel_requested=self.cancel_requested,
            timers=self.timers,
            pending_signals=self.pending_signals,
            received_ids=self.received_ids,
            open_steps=self.open,
        )
        return TickResult(state=state, commands=self.commands, ignored=self.ignored)

    # --- expressions ---------------------------------------------------------------

    def activation(
        self, extra: Mapping[str, Any] | None = None, uses: tuple[str, ...] | None = None
    ) -> dict[str, Any]:
        """The variables every expression sees: input, finished steps, run (+ extra).

        `uses` names the steps the expressions can read (from the index); only
        those are put in `steps`, so the cost of an evaluation does not grow
        with the run. None means all finished steps.
        """
        if uses is None:
            if self._view is None:
                self._view = {
                    ref: {"output": s.output, "status": s.status.value}
                    for ref, s in self.steps.items()
                    if s.status.terminal
                }
            steps = self._view
        else:
            steps = {}
            for ref in uses:
                step = self.steps.get(ref)
                if step is not None and step.status.terminal:
                    steps[ref] = {"output": step.output, "status": step.status.value}
        if self._now_iso is None:
            self._now_iso = utc_text(self.now)
        act: dict[str, Any] = {
            "input": self.state.input,
            "steps": steps,
            "run": {"id": self.run_id, "now": self._now_iso},
        }
        if extra:
            act.update(extra)
        return act

    def evaluate(
        self,
        source: str,
        extra: Mapping[str, Any] | None = None,
        uses: tuple[str, ...] | None = None,
    ) -> Any:
        return self.engine.evaluate(source, self.activation(extra, uses))

    # --- bookkeeping -----------------------------------------------------------------

    def emit(self, command: Command) -> None:
        self.commands.append(command)

    def ignore(self, item: RunInput, reason: str) -> None:
        self.ignored.append(IgnoredInput(input=item, reason=reason))

    def set_timer(self, timer_id: str, fire_at: datetime) -> None:
        self.timers[timer_id] = fire_at
        self.emit(SetTimer(timer_id=timer_id, fire_at=fire_at))

    def cancel_timer(self, timer_id: str) -> None:
        if self.timers.pop(timer_id, None) is not None:
            self.emit(CancelTimer(timer_id=timer_id))

    def received(self, key: str) -> bool:
        if self._received is None:
            self._received = set(self.received_ids)
        return key in self._received

    def remember(self, key: str) -> None:
        self.received(key)
        assert self._received is not None
        self._received.add(key)
        self.received_ids.append(key)

    def update(self, ref: str, **changes: Any) -> StepState:
        new = replace(self.steps[ref], **changes)
        self.steps[ref] = new
        return new

    def finish(
        self, ref: str, status: StepStatus, output: Any = None, error: ErrorInfo | None = None
    ) -> None:
        """Make step `ref` terminal and queue its outgoing edges for deciding."""
        self.update(
            ref,
            status=status,
            output=output,
            error=error,
            finished_at=self.now,
            retry_at=None,
            waiting_for=None,
        )
        self.open -= 1
        if self._view is not None:
            self._view[ref] = {"output": output, "status": status.value}
        self.work.append(ref)

    # --- propagation -------------------------------------------------------------------

    def drain(self) -> None:
        """Decide the edges of every step that became terminal, start or skip targets,
        and end the run when nothing is left or a failure went unhandled."""
        while self.work and not self.status.terminal:
            ref = self.work.popleft()
            info = self.ix.steps[ref]
            step = self.steps[ref]
            if step.status is StepStatus.FAILED and not info.handles_failure:
                failure = step.error
                self.end_run(
                    RunStatus.FAILED,
                    error=ErrorInfo(
                        code="run.step_failed",
                        message=f"step {ref!r} failed"
                        + (f": {failure.message}" if failure is not None else ""),
                        retryable=False,
                        details={
                            "step_ref": ref,
                            "error": None if failure is None else failure.code,
                        },
                    ),
                )
                return
            for edge in info.outgoing:
                self.decide(edge, step)
        if not self.status.terminal and self.open <= 0:
            self.complete()

    def decide(self, edge: IndexedEdge, source: StepState) -> None:
        target_ref = edge.edge.target_ref
        target = self.steps[target_ref]
        if target.status is not StepStatus.PENDING:
            return
        kind = edge.kind
        note: str | None = None
        if source.status is StepStatus.SUCCEEDED:
            if kind is EdgeType.CONDITION:
                taken = False
                if edge.edge.condition is None:
                    note = "condition edge without a condition"
                else:
                    try:
                        verdict = self.evaluate(
                            edge.edge.condition, {"output": source.output}, edge.uses
                        )
                    except DuctorError as exc:
                        note = exc.message
                    else:
                        taken = verdict is True
                        if not isinstance(verdict, bool):
                            note = f"condition gave {type(verdict).__name__}, not bool"
            else:
                taken = kind in (EdgeType.SUCCESS, EdgeType.ALWAYS)
        elif source.status is StepStatus.FAILED:
            taken = kind in (EdgeType.FAILURE, EdgeType.ALWAYS)
        else:
            taken = False
        data = dict(target.data)
        decided = int(data.get("edges_decided", 0)) + 1
        taken_count = int(data.get("edges_taken", 0)) + (1 if taken else 0)
        data["edges_decided"] = decided
        data["edges_taken"] = taken_count
        if note is not None:
            data["condition_errors"] = [
                *data.get("condition_errors", []),
                {"source_ref": source.ref, "message": note},
            ]
        self.update(target_ref, data=data)
        if decided >= len(self.ix.steps[target_ref].incoming):
            if taken_count:
                self.start(target_ref)
            else:
                self.finish(target_ref, StepStatus.SKIPPED)

    def complete(self) -> None:
        definition = self.ix.definition
        try:
            if isinstance(definition.output, str):
                output: Any = self.evaluate(definition.output)
            elif isinstance(definition.output, dict):
                output = {key: self.evaluate(expr) for key, expr in definition.output.items()}
            else:
                output = {
                    ref: self.steps[ref].output
                    for ref in self.ix.sinks
                    if self.steps[ref].status is StepStatus.SUCCEEDED
                }
        except DuctorError as exc:
            self.end_run(RunStatus.FAILED, error=_error_of(exc))
            return
        self.end_run(RunStatus.SUCCEEDED, output=output)

    def end_run(
        self, status: RunStatus, *, output: Any = None, error: ErrorInfo | None = None
    ) -> None:
        """Make the run terminal: cancel what is in flight, emit RunFinished once."""
        children = False
        for ref in self.ix.order:
            step = self.steps[ref]
            if step.status.terminal:
                continue
            start = self.ix.steps[ref].start
            if step.status is StepStatus.WAITING and start in _WAITS:
                self.emit(ClearWait(step_ref=ref))
            if start is InCoordinator.SUBWORKFLOW and step.status is StepStatus.WAITING:
                children = True
            items = step.items
            if items is not None:
                if start is InCoordinator.SCATTER and any(
                    i.status is StepStatus.RUNNING and self.ix.steps[ref].template_spec is None
                    for i in items
                ):
                    children = True
                items = [
                    i if i.status.terminal else replace(i, status=StepStatus.CANCELLED)
                    for i in items
                ]
            self.update(
                ref,
                status=StepStatus.CANCELLED,
                finished_at=self.now,
                retry_at=None,
                waiting_for=None,
                items=items,
            )
        for timer_id in list(self.timers):
            self.emit(CancelTimer(timer_id=timer_id))
        self.timers.clear()
        if children:
            self.emit(CancelChildRuns())
        self.work.clear()
        self.open = 0
        self.status = status
        self.output = output
        self.error = error
        self.finished_at = self.now
        self.emit(RunFinished(status=status, output=output, error=error))

    # --- starting steps ------------------------------------------------------------------

    def start(self, ref: str) -> None:
        info = self.ix.steps[ref]
        self.update(ref, status=StepStatus.RUNNING, started_at=self.now, attempt=1)
        if info.problem is not None:
            self.finish(ref, StepStatus.FAILED, error=_error_of(info.problem))
            return
        try:
            self._start(ref, info)
        except DuctorError as exc:
            self.finish(ref, StepStatus.FAILED, error=_error_of(exc))

    def _start(self, ref: str, info: StepIndex) -> None:
        """Start a step by its spec: dispatch it to a worker, or run the built-in
        coordinator behaviour the spec names (its args have that behaviour's type)."""
        start, args = info.start, info.args
        if isinstance(start, OnWorker):
            self.dispatch(ref, -1, 1)
        elif start is InCoordinator.DATAFLOW:
            assert isinstance(args, DataflowArgs)
            self.finish(
                ref,
                StepStatus.SUCCEEDED,
                run_dataflow(args, self.engine, self.activation(None, info.uses)),
            )
        elif start is InCoordinator.GATHER:
            assert isinstance(args, GatherArgs)
            self.finish(ref, StepStatus.SUCCEEDED, self.gathered(args.scatter))
        elif start is InCoordinator.WAIT:
            assert isinstance(args, WaitArgs)
            self.start_wait(ref, args)
        elif start is InCoordinator.WAIT_FOR_EVENT:
            assert isinstance(args, WaitForEventArgs)
            self.start_wait_for(ref, "event", args.event, args.timeout or info.step.timeout)
        elif start is InCoordinator.WAIT_FOR_SIGNAL:
            assert isinstance(args, WaitForSignalArgs)
            buffered = next((s for s in self.pending_signals if s.name == args.signal), None)
            if buffered is not None:
                self.pending_signals.remove(buffered)
                self.finish(ref, StepStatus.SUCCEEDED, buffered.payload)
            else:
                self.start_wait_for(ref, "signal", args.signal, args.timeout or info.step.timeout)
        elif start is InCoordinator.SUBWORKFLOW:
            assert isinstance(args, SubworkflowArgs)
            child_input = None if args.input is None else self.evaluate(args.input, None, info.uses)
            self.emit(
                StartChildRun(
                    step_ref=ref,
                    child_key=f"{self.run_id}:{ref}:-1",
                    family_slug=args.family_slug,
                    version=args.version,
                    input=child_input,
                )
            )
            if info.timeout is not None:
                self.set_timer(_key(ref, -1, "timeout", 1), self.now + info.timeout)
            self.update(ref, status=StepStatus.WAITING, waiting_for="child run")
        elif start is InCoordinator.SCATTER:
            assert isinstance(args, ScatterArgs)
            self.start_scatter(ref, args)
        elif start is InCoordinator.NOTIFY:
            assert isinstance(args, NotifyArgs)
            self.start_notify(ref, info, args)
        else:  # pragma: no cover - a step with a problem never gets here
            raise DuctorError(f"step {ref!r} has no runnable type", code="definition.bad_args")

    def gathered(self, scatter_ref: str) -> dict[str, Any]:
        scatter = self.steps.get(scatter_ref)
        items = (scatter.items if scatter is not None else None) or []
        return {
            "items": [i.output if i.status is StepStatus.SUCCEEDED else None for i in items],
            "succeeded": sum(1 for i in items if i.status is StepStatus.SUCCEEDED),
            "failed": sum(1 for i in items if i.status is StepStatus.FAILED),
        }

    def start_wait(self, ref: str, args: WaitArgs) -> None:
        uses = self.ix.steps[ref].uses
        if args.until is not None:
            fire_at = _parse_instant(self.evaluate(args.until, None, uses), args.until)
        elif args.duration is not None:
            fire_at = self.now + parse_duration(args.duration)
        else:
            raise DuctorError("WAIT needs `duration` or `until`", code="definition.bad_args")
        if fire_at <= self.now:
            self.finish(ref, StepStatus.SUCCEEDED, {"waited_until": utc_text(fire_at)})
            return
        self.set_timer(_key(ref, -1, "wait", 1), fire_at)
        data = {**self.steps[ref].data, "fire_at": utc_text(fire_at)}
        self.update(
            ref, status=StepStatus.WAITING, waiting_for=f"timer {utc_text(fire_at)}", data=data
        )

    def start_notify(self, ref: str, info: StepIndex, args: NotifyArgs) -> None:
        uses = info.uses

        def text(source: str | None, what: str) -> str | None:
            if source is None:
                return None
            value = self.evaluate(source, None, uses)
            if value is not None and not isinstance(value, str):
                raise DuctorError(
                    f"NOTIFY {what} must evaluate to a string, got {type(value).__name__}",
                    code="notify.bad_value",
                )
            return value

        recipients = _recipients(self.evaluate(args.recipients, None, uses))
        data = None if args.data is None else self.evaluate(args.data, None, uses)
        if data is not None and not isinstance(data, dict):
            raise DuctorError(
                f"NOTIFY data must evaluate to a map, got {type(data).__name__}",
                code="notify.bad_value",
            )

        def checked(value: str, ok: bool, rule: str, what: str, pointer: str) -> None:
            # A client renders these as links, images and buttons (see notification_fields).
            if not ok:
                raise DuctorError(
                    f"NOTIFY {what} {rule}, got {value!r:.80}",
                    code="notify.bad_value",
                    details={"pointer": pointer},
                )

        title = text(args.title, "title") or ""
        checked(title, is_text(title), TEXT_RULE, "title", "/args/title")
        body = text(args.body, "body") or ""
        checked(body, is_text(body), TEXT_RULE, "body", "/args/body")
        if data is not None and not is_data(data):
            raise DuctorError(
                f"NOTIFY data {DATA_RULE}",
                code="notify.bad_value",
                details={"pointer": "/args/data"},
            )
        avatar = text(args.avatar, "avatar")
        if avatar is not None:
            checked(avatar, is_link(avatar), URL_RULE, "avatar", "/args/avatar")
        ctas: list[dict[str, Any]] = []
        for j, cta in enumerate(args.ctas):
            label = text(cta.label, "CTA label") or ""
            at = f"/args/ctas/{j}"
            checked(label, is_label(label), LABEL_RULE, f"ctas[{j}].label", f"{at}/label")
            resolved: dict[str, Any] = {"label": label}
            if cta.url is not None:
                url = text(cta.url, "CTA url") or ""
                checked(url, is_link(url), URL_RULE, f"ctas[{j}].url", f"{at}/url")
                resolved["url"] = url
            for name in ("action", "signal", "event"):
                value = getattr(cta, name)
                if value is not None:
                    resolved[name] = value
            ctas.append(resolved)
        email = None
        if args.email is not None:
            subject = text(args.email.subject, "email subject")
            if subject is not None:
                checked(
                    subject,
                    "\x00" not in subject,
                    "must hold no NUL (U+0000)",
                    "email subject",
                    "/args/email/subject",
                )
            email = {"connection": args.email.connection, "subject": subject}
        group_id = f"{self.run_id}:{ref}"
        self.emit(
            SendNotifications(
                step_ref=ref,
                group_id=group_id,
                recipients=recipients,
                feed=args.feed,
                title=title,
                body=body,
                data=data,
                avatar=avatar,
                ctas=ctas,
                await_action=args.await_action,
                email=email,
            )
        )
        sent = {"group_id": group_id, "recipients": recipients}
        if not args.await_action:
            self.finish(ref, StepStatus.SUCCEEDED, sent)
            return
        self.update(ref, data={**self.steps[ref].data, "sent": sent})
        self.start_wait_for(ref, "signal", notify_signal(ref), args.timeout or info.step.timeout)

    def start_wait_for(self, ref: str, kind: str, name: str, timeout: str | None) -> None:
        fire_at = None if timeout is None else self.now + parse_duration(timeout)
        self.emit(RegisterWait(step_ref=ref, kind=kind, name=name))
        if fire_at is not None:
            self.set_timer(_key(ref, -1, f"{kind}_timeout", 1), fire_at)
        self.update(ref, status=StepStatus.WAITING, waiting_for=f"{kind} {name}")

    # --- worker units (a step, or one item of a SCATTER) -------------------------------

    def unit(self, ref: str, index: int) -> StepState | ItemState | None:
        step = self.steps[ref]
        if index < 0:
            return step
        if step.items is None or index >= len(step.items):
            return None
        return step.items[index]

    def set_unit(self, ref: str, index: int, **changes: Any) -> None:
        if index < 0:
            self.update(ref, **changes)
            return
        step = self.steps[ref]
        assert step.items is not None
        if ref in self._own_items:
            items = step.items  # this tick's private copy: change it in place
        else:
            items = list(step.items)  # never touch the caller's list
            self._own_items.add(ref)
            self.update(ref, items=items)
        items[index] = replace(items[index], **changes)

    def unit_spec(
        self, info: StepIndex, index: int
    ) -> tuple[StepSpec[Any] | None, msgspec.Struct | None]:
        if index < 0:
            return info.spec, info.args
        return info.template_spec, info.template_args

    def retry_policy(self, info: StepIndex, index: int) -> RetryPolicy:
        if index < 0:
            return info.step.retry or DEFAULT_RETRY
        args = info.args
        template = args.step if isinstance(args, ScatterArgs) else None
        return (template.retry if template is not None else None) or DEFAULT_RETRY

    def dispatch(self, ref: str, index: int, attempt: int) -> None:
        """Send attempt `attempt` of a worker unit; a bad expression fails the unit."""
        info = self.ix.steps[ref]
        spec, args = self.unit_spec(info, index)
        timeout = info.timeout if index < 0 else info.template_timeout
        extra = None if index < 0 else self.item_vars(ref, index)
        try:
            if spec is None or args is None or spec.worker is None:
                kind = None if spec is None else spec.type
                raise DuctorError(
                    f"no worker handler for step type {kind}", code="definition.bad_args"
                )
            handler, payload = self.payload(spec, args, extra, info.uses)
            limit = spec.attempt_timeout(args) if timeout is None else None
            if limit is not None:
                timeout = parse_duration(limit)
        except DuctorError as exc:
            self.unit_done(ref, index, StepStatus.FAILED, error=_error_of(exc))
            return
        self.emit(
            DispatchTask(
                step_ref=ref,
                item_index=index,
                attempt=attempt,
                step_type=spec.type,
                handler=handler,
                payload=payload,
                idempotency_key=f"{self.run_id}:{ref}:{index}:{attempt}",
                timeout_seconds=None if timeout is None else timeout.total_seconds(),
            )
        )
        if timeout is not None:
            self.set_timer(_key(ref, index, "timeout", attempt), self.now + timeout)
        if index < 0:
            self.update(
                ref,
                status=StepStatus.RUNNING,
                attempt=attempt,
                retry_at=None,
                waiting_for=None,
            )
        else:
            self.set_unit(ref, index, status=StepStatus.RUNNING, attempt=attempt)

    def payload(
        self,
        spec: StepSpec[Any],
        args: msgspec.Struct,
        extra: Mapping[str, Any] | None,
        uses: tuple[str, ...] | None,
    ) -> tuple[str, Any]:
        """The worker task's handler name and payload, from the unit's spec."""
        cache: dict[str, Any] = {}

        def evaluate(source: str) -> Any:
            if "act" not in cache:  # built once, and only if the payload has CEL
                cache["act"] = self.activation(extra, uses)
            return self.engine.evaluate(source, cache["act"])

        return spec.task(args, evaluate)

    def unit_error(self, ref: str, index: int, attempt: int, error: ErrorInfo) -> None:
        """An attempt failed: schedule the next one, or fail the unit for good."""
        info = self.ix.steps[ref]
        policy = self.retry_policy(info, index)
        if may_retry(policy, error, attempt):
            try:
                delay = backoff_delay(
                    policy,
                    error,
                    run_id=self.run_id,
                    step_ref=ref,
                    item_index=index,
                    attempt=attempt,
                )
            except DuctorError as exc:
                self.unit_done(ref, index, StepStatus.FAILED, error=_error_of(exc))
                return
            fire_at = self.now + delay
            self.set_timer(_key(ref, index, "retry", attempt + 1), fire_at)
            if index < 0:
                self.update(
                    ref,
                    status=StepStatus.RETRYING,
                    error=error,
                    retry_at=fire_at,
                    waiting_for=f"retry at {utc_text(fire_at)}",
                )
            else:
                self.set_unit(ref, index, status=StepStatus.RETRYING, error=error)
            return
        self.unit_done(ref, index, StepStatus.FAILED, error=error)

    def unit_done(
        self,
        ref: str,
        index: int,
        status: StepStatus,
        output: Any = None,
        error: ErrorInfo | None = None,
        child_run_id: str | None = None,
    ) -> None:
        if index < 0:
            if child_run_id is not None:
                self.update(ref, child_run_id=child_run_id)
            self.finish(ref, status, output, error)
            return
        changes: dict[str, Any] = {"status": status, "output": output, "error": error}
        if child_run_id is not None:
            changes["child_run_id"] = child_run_id
        self.set_unit(ref, index, **changes)
        step = self.steps[ref]
        data = {**step.data, "done": int(step.data.get("done", 0)) + 1}
        self.update(ref, data=data)
        if ref not in self._filling:
            self.fill_scatter(ref)

    # --- scatter --------------------------------------------------------------------------

    def item_vars(self, ref: str, index: int) -> dict[str, Any]:
        values: list[Any] = self.steps[ref].data.get("values", [])
        return {"item": values[index], "index": index}

    def start_scatter(self, ref: str, args: ScatterArgs) -> None:
        values = self.evaluate(args.items, None, self.ix.steps[ref].uses)
        if not isinstance(values, list):
            raise DuctorError(
                f"scatter `items` must give a list, got {type(values).__name__}",
                code="expression.evaluation",
            )
        if len(values) > MAX_SCATTER_ITEMS:
            raise DuctorError(
                f"scatter `items` gave {len(values):,} items; a SCATTER runs at most"
                f" {MAX_SCATTER_ITEMS:,}",
                code="scatter.too_many_items",
                details={"items": len(values), "limit": MAX_SCATTER_ITEMS},
            )
        if args.step is None and args.workflow is None:
            raise DuctorError("scatter needs `step` or `workflow`", code="definition.bad_args")
        data = {**self.steps[ref].data, "values": values, "next": 0, "done": 0}
        self._own_items.add(ref)
        self.update(
            ref,
            items=[ItemState(index=i) for i in range(len(values))],
            data=data,
            waiting_for=f"items 0/{len(values)}",
        )
        self.fill_scatter(ref)

    def fill_scatter(self, ref: str) -> None:
        """Launch items up to max_concurrency; finish the scatter once all are done."""
        info = self.ix.steps[ref]
        args = info.args
        assert isinstance(args, ScatterArgs)
        limit = max(1, args.max_concurrency)
        self._filling.add(ref)
        try:
            while True:
                step = self.steps[ref]
                total = len(step.items or [])
                launched = int(step.data.get("next", 0))
                done = int(step.data.get("done", 0))
                if done >= total:
                    self.finish_scatter(ref, args)
                    return
                if launched >= total or launched - done >= limit:
                    self.update(ref, waiting_for=f"items {done}/{total}")
                    return
                self.update(ref, data={**step.data, "next": launched + 1})
                self.launch_item(ref, info, args, launched)
        finally:
            self._filling.discard(ref)

    def launch_item(self, ref: str, info: StepIndex, args: ScatterArgs, index: int) -> None:
        if args.step is None:
            assert args.workflow is not None
            try:
                child_input = (
                    self.item_vars(ref, index)["item"]
                    if args.input is None
                    else self.evaluate(args.input, self.item_vars(ref, index), info.uses)
                )
            except DuctorError as exc:
                self.unit_done(ref, index, StepStatus.FAILED, error=_error_of(exc))
                return
            self.emit(
                StartChildRun(
                    step_ref=ref,
                    item_index=index,
                    child_key=f"{self.run_id}:{ref}:{index}",
                    family_slug=args.workflow.family_slug,
                    version=args.workflow.version,
                    input=child_input,
                )
            )
            self.set_unit(ref, index, status=StepStatus.RUNNING, attempt=1)
            return
        if info.template_start is InCoordinator.DATAFLOW:
            assert isinstance(info.template_args, DataflowArgs)
            try:
                output = run_dataflow(
                    info.template_args,
                    self.engine,
                    self.activation(self.item_vars(ref, index), info.uses),
                )
            except DuctorError as exc:
                self.unit_done(ref, index, StepStatus.FAILED, error=_error_of(exc))
                return
            self.set_unit(ref, index, attempt=1)
            self.unit_done(ref, index, StepStatus.SUCCEEDED, output)
            return
        if not isinstance(info.template_start, OnWorker):
            self.unit_done(
                ref,
                index,
                StepStatus.FAILED,
                error=ErrorInfo(
                    code="definition.bad_args",
                    message=f"scatter cannot run a {info.template_kind} step per item",
                    retryable=False,
                ),
            )
            return
        self.dispatch(ref, index, 1)

    def finish_scatter(self, ref: str, args: ScatterArgs) -> None:
        items = self.steps[ref].items or []
        outputs = [i.output if i.status is StepStatus.SUCCEEDED else None for i in items]
        failed = [i.index for i in items if i.status is not StepStatus.SUCCEEDED]
        if failed and not args.tolerate_failures:
            self.finish(
                ref,
                StepStatus.FAILED,
                outputs,
                ErrorInfo(
                    code="scatter.items_failed",
                    message=f"{len(failed)} of {len(items)} items failed: {failed}",
                    retryable=False,
                    details={"failed": failed},
                ),
            )
            return
        self.finish(ref, StepStatus.SUCCEEDED, outputs)

    # --- inputs -------------------------------------------------------------------------

    def apply(self, item: RunInput) -> None:
        if self.status.terminal:
            self.ignore(item, f"run already ended ({self.status.value})")
        elif isinstance(item, AttemptResult):
            self.on_attempt(item)
        elif isinstance(item, TimerFired):
            self.on_timer(item)
        elif isinstance(item, EventReceived):
            self.on_event(item)
        elif isinstance(item, SignalReceived):
            self.on_signal(item)
        elif isinstance(item, ChildRunEnded):
            self.on_child(item)
        elif isinstance(item, CancelRequested):
            self.cancel_requested = True
            reason = item.reason or "cancel requested"
            self.end_run(
                RunStatus.CANCELLED,
                error=ErrorInfo(code="run.cancelled", message=reason, retryable=False),
            )
        self.drain()

    def on_attempt(self, item: AttemptResult) -> None:
        ref, index = item.step_ref, item.item_index
        info = self.ix.steps.get(ref)
        if info is None:
            self.ignore(item, f"unknown step {ref!r}")
            return
        spec, _ = self.unit_spec(info, index)
        if (spec is None or spec.worker is None) or (
            index >= 0 and info.start is not InCoordinator.SCATTER
        ):
            self.ignore(item, f"step {ref!r} item {index} is not run by a worker")
            return
        unit = self.unit(ref, index)
        if unit is None:
            self.ignore(item, f"step {ref!r} has no item {index}")
            return
        if unit.status is not StepStatus.RUNNING or unit.attempt != item.attempt:
            self.ignore(
                item,
                f"stale or duplicate result: step {ref!r} item {index} is "
                f"{unit.status.value} at attempt {unit.attempt}",
            )
            return
        self.cancel_timer(_key(ref, index, "timeout", item.attempt))
        if item.ok:
            self.unit_done(ref, index, StepStatus.SUCCEEDED, item.output)
        else:
            error = item.error or ErrorInfo(code="step.error", message="attempt failed")
            self.unit_error(ref, index, item.attempt, error)

    def on_timer(self, item: TimerFired) -> None:
        fire_at = self.timers.pop(item.timer_id, None)
        parts = item.timer_id.rsplit(":", 3)
        if fire_at is None or len(parts) != 4 or parts[0] not in self.ix.steps:
            self.ignore(item, f"unknown timer {item.timer_id!r} (fired or cancelled already)")
            return
        ref, index_text, purpose, attempt_text = parts
        try:
            index, attempt = int(index_text), int(attempt_text)
        except ValueError:
            self.ignore(item, f"malformed timer id {item.timer_id!r}")
            return
        unit = self.unit(ref, index)
        info = self.ix.steps[ref]
        if unit is None:
            self.ignore(item, f"timer {item.timer_id!r} names no item")
            return
        if purpose == "wait" and unit.status is StepStatus.WAITING:
            self.finish(ref, StepStatus.SUCCEEDED, {"waited_until": utc_text(fire_at)})
        elif purpose in ("event_timeout", "signal_timeout") and unit.status is StepStatus.WAITING:
            self.emit(ClearWait(step_ref=ref))
            output = None
            if info.start is InCoordinator.NOTIFY:
                output = {**self.steps[ref].data.get("sent", {}), "action": None, "timed_out": True}
            self.finish(ref, StepStatus.SUCCEEDED, output)
        elif (
            purpose == "retry"
            and unit.status is StepStatus.RETRYING
            and unit.attempt == attempt - 1
        ):
            self.dispatch(ref, index, attempt)
        elif purpose == "timeout" and info.start is InCoordinator.SUBWORKFLOW:
            if unit.status is not StepStatus.WAITING:
                self.ignore(item, f"step {ref!r} is no longer waiting for its child")
                return
            self.emit(CancelChildRuns(step_ref=ref))
            self.finish(
                ref,
                StepStatus.FAILED,
                error=ErrorInfo(
                    code="step.timeout",
                    message=f"child run did not end within {info.step.timeout}",
                    retryable=False,
                ),
            )
        elif purpose == "timeout" and unit.status is StepStatus.RUNNING and unit.attempt == attempt:
            limit = info.step.timeout if index < 0 else None
            self.unit_error(
                ref,
                index,
                attempt,
                ErrorInfo(
                    code="step.timeout",
                    message=f"attempt {attempt} timed out"
                    + (f" after {limit}" if limit is not None else ""),
                    retryable=True,
                ),
            )
        else:
            self.ignore(item, f"timer {item.timer_id!r} no longer applies ({unit.status.value})")

    def on_event(self, item: EventReceived) -> None:
        key = f"event:{item.event_id}"
        if self.received(key):
            self.ignore(item, f"event {item.event_id!r} was applied already")
            return
        event = {"id": item.event_id, "name": item.name, "data": item.data}
        matched = 0
        problems: list[str] = []
        for ref in self.ix.event_waiters.get(item.name, []):
            if self.steps[ref].status is not StepStatus.WAITING:
                continue
            args = self.ix.steps[ref].args
            assert isinstance(args, WaitForEventArgs)
            if args.match is not None:
                try:
                    verdict = self.evaluate(args.match, {"event": event}, self.ix.steps[ref].uses)
                except DuctorError as exc:
                    problems.append(f"{ref}: {exc.message}")
                    continue
                if verdict is not True:
                    continue
            matched += 1
            self.emit(ClearWait(step_ref=ref))
            self.cancel_timer(_key(ref, -1, "event_timeout", 1))
            self.finish(ref, StepStatus.SUCCEEDED, event)
        if matched:
            self.remember(key)
            return
        reason = f"no step waiting for event {item.name!r} matched it"
        if problems:
            reason += "; match errors: " + "; ".join(problems)
        self.ignore(item, reason)

    def on_signal(self, item: SignalReceived) -> None:
        key = f"signal:{item.signal_id}"
        if self.received(key):
            self.ignore(item, f"signal {item.signal_id!r} was applied already")
            return
        waiters = self.ix.signal_waiters.get(item.name, [])
        if not waiters:
            self.ignore(item, f"no step of this workflow waits for signal {item.name!r}")
            return
        waiting = any(self.steps[ref].status is StepStatus.WAITING for ref in waiters)
        if not waiting:
            refused = self.unkept(item, waiters)
            if refused is not None:
                self.ignore(item, refused)
                return
        self.remember(key)
        for ref in waiters:
            if self.steps[ref].status is StepStatus.WAITING:
                self.emit(ClearWait(step_ref=ref))
                self.cancel_timer(_key(ref, -1, "signal_timeout", 1))
                output = item.payload
                if self.ix.steps[ref].start is InCoordinator.NOTIFY:
                    clicked = item.payload if isinstance(item.payload, dict) else {}
                    output = {**self.steps[ref].data.get("sent", {}), **clicked}
                    output["timed_out"] = False
                self.finish(ref, StepStatus.SUCCEEDED, output)
                return
        self.pending_signals.append(
            BufferedSignal(signal_id=item.signal_id, name=item.name, payload=item.payload)
        )

    def unkept(self, item: SignalReceived, waiters: Sequence[str]) -> str | None:
        """Why a signal no step waits for now cannot be kept for a later one, or
        None: one is kept for each step of its name yet to start, and the kept
        payloads hold at most `MAX_KEPT_SIGNAL_BYTES` of JSON in all."""
        takers = sum(1 for ref in waiters if self.steps[ref].status is StepStatus.PENDING)
        kept = [s for s in self.pending_signals if s.name == item.name]
        if len(kept) >= takers:
            return (
                f"signal {item.name!r} has no step left to take it: {len(kept)} kept"
                f" for the {takers} yet to start"
            )
        size = len(_json.encode(item.payload))
        held = sum(len(_json.encode(s.payload)) for s in self.pending_signals)
        if held + size > MAX_KEPT_SIGNAL_BYTES:
            return (
                f"signal {item.name!r} is not kept: its payload ({size:,} bytes of JSON) and"
                f" those kept ({held:,}) would be over {MAX_KEPT_SIGNAL_BYTES:,}"
            )
        return None

    def on_child(self, item: ChildRunEnded) -> None:
        ref, index = item.step_ref, item.item_index
        info = self.ix.steps.get(ref)
        if info is None:
            self.ignore(item, f"unknown step {ref!r}")
            return
        if not item.status.terminal:
            self.ignore(item, f"child run {item.child_run_id!r} has not ended")
            return
        unit = self.unit(ref, index)
        if index < 0:
            live = (
                info.start is InCoordinator.SUBWORKFLOW
                and unit is not None
                and unit.status is StepStatus.WAITING
            )
        else:
            scatter = info.args
            live = (
                isinstance(scatter, ScatterArgs)
                and scatter.workflow is not None
                and scatter.step is None
                and unit is not None
                and unit.status is StepStatus.RUNNING
            )
        if not live:
            self.ignore(item, f"step {ref!r} item {index} is not waiting for a child run")
            return
        if index < 0:
            self.cancel_timer(_key(ref, -1, "timeout", 1))
        if item.status is RunStatus.SUCCEEDED:
            self.unit_done(
                ref, index, StepStatus.SUCCEEDED, item.output, child_run_id=item.child_run_id
            )
            return
        error = item.error or ErrorInfo(
            code="child.cancelled" if item.status is RunStatus.CANCELLED else "child.failed",
            message=f"child run {item.child_run_id} ended {item.status.value}",
            retryable=False,
        )
        self.unit_done(ref, index, StepStatus.FAILED, error=error, child_run_id=item.child_run_id)


def start_run(
    definition: WorkflowDefinition,
    *,
    run_id: str,
    input: Any,
    now: datetime,
    engine: ExpressionEngine | None = None,
    specs: StepSpecs | None = None,
) -> TickResult:
    """Create a run of `definition` and start its root steps.

    `specs` are the step types the definition may use (the built-in ones if
    None); pass the same set to every `tick` of the run.

    Returns the first state (RUN_STATUS_RUNNING, or already terminal if the
    steps that could run inline finished the run) and the commands to commit
    with it. Pure: same arguments, same result.
    """
    index = index_for(definition, BUILTIN_STEP_SPECS if specs is None else specs)
    state = RunState(
        run_id=run_id,
        status=RunStatus.RUNNING,
        input=input,
        steps={ref: StepState(ref=ref) for ref in index.order},
        created_at=now,
        open_steps=len(index.order),
    )
    run = _Tick(index, state, now, engine or default_engine())
    if index.problem is not None:  # validation rejects these; never run half a graph
        run.end_run(RunStatus.FAILED, error=_error_of(index.problem))
        return run.result()
    for ref in index.roots:
        if run.status.terminal:
            break  # an inline root already failed the run: start nothing more
        run.start(ref)
        run.drain()
    run.drain()
    return run.result()


def tick(
    definition: WorkflowDefinition,
    state: RunState,
    inputs: Sequence[RunInput],
    now: datetime,
    *,
    engine: ExpressionEngine | None = None,
    specs: StepSpecs | None = None,
) -> TickResult:
    """Apply `inputs` in order to the run `state` at time `now`.

    Every input is either applied exactly once or listed in `ignored` with a
    reason (duplicate, stale attempt, unknown step or timer, run already
    ended). Returns the next state and the commands to commit with it
    atomically. Pure: same arguments, same result; `state` is not modified.
    `specs` are the step types the definition may use (the built-in ones if None).
    """
    index = index_for(definition, BUILTIN_STEP_SPECS if specs is None else specs)
    run = _Tick(index, state, now, engine or default_engine())
    for item in inputs:
        run.apply(item)
    return run.result()
