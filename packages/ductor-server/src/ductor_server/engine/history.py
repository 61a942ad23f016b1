"""Run history entries derived from state transitions and tick inputs.

Pure: compares two `RunState`s and returns entries to append; writes nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ductor_core.runs import (
    AttemptResult,
    CancelRequested,
    ChildRunEnded,
    ErrorInfo,
    EventReceived,
    IgnoredInput,
    RunInput,
    RunState,
    SignalReceived,
    StepState,
    StepStatus,
    TimerFired,
)
from ductor_core.timestamps import utc_text
from ductor_server.storage.records import NewHistoryEntry


def _status_word(status: StepStatus) -> str:
    return status.name.lower()


def _error(error: ErrorInfo | None) -> dict[str, Any] | None:
    if error is None:
        return None
    return {
        "code": error.code,
        "message": error.message,
        "retryable": error.retryable,
        "details": error.details,
    }


def _step_entries(old: StepState | None, new: StepState) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    changed = old is None or old.status != new.status or old.attempt != new.attempt
    if changed and not (old is None and new.status == StepStatus.PENDING):
        data: dict[str, Any] = {"step_ref": new.ref, "attempt": new.attempt}
        if new.error is not None and new.status in (StepStatus.FAILED, StepStatus.RETRYING):
            data["error"] = _error(new.error)
        if new.waiting_for:
            data["waiting_for"] = new.waiting_for
        if new.retry_at is not None and new.status == StepStatus.RETRYING:
            data["retry_at"] = utc_text(new.retry_at)
        if new.child_run_id:
            data["child_run_id"] = new.child_run_id
        out.append((f"step.{_status_word(new.status)}", data))
    old_items = {item.index: item for item in (old.items or [])} if old else {}
    for item in new.items or []:
        before = old_items.get(item.index)
        if before is not None and before.status == item.status and before.attempt == item.attempt:
            continue
        if before is None and item.status == StepStatus.PENDING:
            continue
        data = {"step_ref": new.ref, "item_index": item.index, "attempt": item.attempt}
        if item.error is not None and item.status in (StepStatus.FAILED, StepStatus.RETRYING):
            data["error"] = _error(item.error)
        if item.child_run_id:
            data["child_run_id"] = item.child_run_id
        out.append((f"item.{_status_word(item.status)}", data))
    return out


def transition_entries(
    tenant_id: str, old: RunState | None, new: RunState, *, at: datetime
) -> list[NewHistoryEntry]:
    """Entries for what changed from `old` (None: a new run) to `new`."""
    entries: list[tuple[str, Any]] = []
    if old is None or old.status != new.status:
        data: dict[str, Any] = {"status": new.status.value}
        if new.error is not None:
            data["error"] = _error(new.error)
        entries.append((f"run.{new.status.name.lower()}", data))
    old_steps = old.steps if old is not None else {}
    for ref, step in new.steps.items():
        before = old_steps.get(ref)
        if before is step:
            continue  # a tick shares the steps it leaves alone: nothing changed
        entries.extend(_step_entries(before, step))
    # A terminal run entry reads best after the steps that ended it.
    if entries and entries[0][0].startswith("run.") and new.status.terminal:
        entries.append(entries.pop(0))
    return [
        NewHistoryEntry(tenant_id=tenant_id, run_id=new.run_id, at=at, kind=kind, data=data)
        for kind, data in entries
    ]


def input_entry(
    tenant_id: str, run_id: str, item: RunInput, *, at: datetime
) -> NewHistoryEntry | None:
    """An entry for an input worth seeing in the history (signals, events, cancels)."""
    kind: str
    data: dict[str, Any]
    if isinstance(item, SignalReceived):
        kind, data = "signal.received", {"signal_id": item.signal_id, "name": item.name}
    elif isinstance(item, EventReceived):
        kind, data = "event.received", {"event_id": item.event_id, "name": item.name}
    elif isinstance(item, CancelRequested):
        kind, data = "run.cancel_requested", {"reason": item.reason}
    elif isinstance(item, ChildRunEnded):
        kind = "child.ended"
        data = {
            "step_ref": item.step_ref,
            "item_index": item.item_index,
            "child_run_id": item.child_run_id,
            "status": item.status.value,
        }
    else:
        return None
    return NewHistoryEntry(tenant_id=tenant_id, run_id=run_id, at=at, kind=kind, data=data)


def ignored_entry(
    tenant_id: str, run_id: str, ignored: IgnoredInput, *, at: datetime
) -> NewHistoryEntry:
    """An entry saying the tick ignored an input (a duplicate, a stale attempt...)."""
    item = ignored.input
    data: dict[str, Any] = {"reason": ignored.reason, "input": type(item).__name__}
    if isinstance(item, AttemptResult):
        data.update(step_ref=item.step_ref, item_index=item.item_index, attempt=item.attempt)
    elif isinstance(item, TimerFired):
        data["timer_id"] = item.timer_id
    elif isinstance(item, SignalReceived):
        data["signal_id"] = item.signal_id
    elif isinstance(item, EventReceived):
        data["event_id"] = item.event_id
    return NewHistoryEntry(
        tenant_id=tenant_id, run_id=run_id, at=at, kind="input.ignored", data=data
    )
