"""A small in-process engine for tests: drives a workflow through execute calls.

`LocalEngine` keeps a run's history and calls execute until the run ends,
resolving sleeps at once, waits from given events and signals, and child runs
from a callback. It plays the server's part in unit and adapter tests; it is
not the server (no durability, no CEL: an event wait matches by name only).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import msgspec

from ductor.client import Client
from ductor.errors import ProtocolError
from ductor.protocol import (
    SIGNATURE_HEADER,
    ErrorInfo,
    ErrorResponse,
    Event,
    ExecuteRequest,
    ExecuteResponse,
    InvokeOp,
    Opcode,
    RunCompleteOp,
    RunErrorOp,
    RunFailedOp,
    Signal,
    SigningKeys,
    SleepOp,
    StepErrorOp,
    StepFailedOp,
    StepPlannedOp,
    StepRecord,
    StepRunOp,
    WaitForEventOp,
    WaitForSignalOp,
    encode,
    step_record,
)

__all__ = ["ChildFailed", "Execute", "LocalEngine", "Outcome", "direct", "over_http"]

Execute = Callable[[ExecuteRequest], Awaitable[ExecuteResponse]]
"""Sends one execute request to the app and returns its response."""


class ChildFailed(Exception):
    """Raise from an `invoke` callback to make the child run fail with `error`."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How a driven run ended, with everything the engine saw on the way."""

    status: Literal["RUN_STATUS_SUCCEEDED", "RUN_STATUS_FAILED"]
    output: Any = None
    error: ErrorInfo | None = None
    history: list[StepRecord] = field(default_factory=list)
    responses: list[ExecuteResponse] = field(default_factory=list)


def direct(client: Client) -> Execute:
    """Execute by calling `client.execute` in-process (no HTTP, no signing)."""
    return client.execute


def over_http(
    url: str,
    signing_key: str,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    clock: Callable[[], float] = time.time,
) -> Execute:
    """Execute over HTTP at `url`, signing requests and verifying responses."""
    keys = SigningKeys(signing_key)
    tls = httpx.create_ssl_context()  # built once: it is the slow part of a new client

    async def send(request: ExecuteRequest) -> ExecuteResponse:
        body = encode(request)
        headers = {
            SIGNATURE_HEADER: keys.request_header(body, now=int(clock())),
            "content-type": "application/json",
        }
        async with httpx.AsyncClient(transport=transport, timeout=30.0, verify=tls) as http:
            response = await http.post(url, content=body, headers=headers)
        keys.verify(response.content, response.headers.get(SIGNATURE_HEADER), now=int(clock()))
        if response.status_code != 200:
            err = msgspec.json.decode(response.content, type=ErrorResponse)
            raise ProtocolError(
                f"execute answered {response.status_code}: {err.message}", code=err.code
            )
        return msgspec.json.decode(response.content, type=ExecuteResponse)

    return send


class LocalEngine:
    """Plays the engine: keeps the history and calls execute until the run ends.

    Args:
        execute: how to reach the app (`direct(client)` or `over_http(...)`).
        events: event name -> the event a wait receives (absent: the wait times out).
        signals: signal name -> the signal a wait receives (absent: it times out).
        invoke: runs a child workflow and returns its output (raise `ChildFailed`).
        reverse_parallel: record parallel results in reverse order of planning.
        max_requests: a bound, so a bug cannot loop forever.
    """

    def __init__(
        self,
        execute: Execute,
        *,
        events: Mapping[str, Event] | None = None,
        signals: Mapping[str, Signal] | None = None,
        invoke: Callable[[InvokeOp], Awaitable[Any]] | None = None,
        reverse_parallel: bool = False,
        max_requests: int = 10_000,
    ) -> None:
        self._execute = execute
        self.events = dict(events or {})
        self.signals = dict(signals or {})
        self._invoke = invoke
        self.reverse_parallel = reverse_parallel
        self.max_requests = max_requests
        self.requests: list[ExecuteRequest] = []
        self.responses: list[ExecuteResponse] = []

    async def run(
        self,
        workflow_id: str,
        input: Any = None,
        *,
        run_id: str = "run-1",
        event: Event | None = None,
        history: list[StepRecord] | None = None,
    ) -> Outcome:
        """Drive one run of `workflow_id` to its end and return how it ended."""
        steps: list[StepRecord] = list(history or [])
        responses: list[ExecuteResponse] = []
        attempt = 0
        while len(self.requests) < self.max_requests:
            response = await self._send(run_id, workflow_id, input, steps, attempt, event, None)
            responses.append(response)
            first = response.opcodes[0]
            if isinstance(first, RunCompleteOp):
                return Outcome(
                    status="RUN_STATUS_SUCCEEDED",
                    output=first.output,
                    history=steps,
                    responses=responses,
                )
            if isinstance(first, RunFailedOp):
                return Outcome(
                    status="RUN_STATUS_FAILED",
                    error=first.error,
                    history=steps,
                    responses=responses,
                )
            if isinstance(first, RunErrorOp | StepErrorOp):
                attempt += 1
                continue
            attempt = 0
            batch: list[StepRecord] = []
            for op in response.opcodes:
                if isinstance(op, StepPlannedOp):
                    batch.append(
                        await self._run_planned(run_id, workflow_id, input, steps, event, op)
                    )
                else:
                    batch.append(await self._resolve(op))
            if self.reverse_parallel:
                batch.reverse()
            steps.extend(batch)
        raise ProtocolError(f"run {run_id!r} did not end within {self.max_requests} requests")

    async def _send(
        self,
        run_id: str,
        workflow_id: str,
        input: Any,
        steps: list[StepRecord],
        attempt: int,
        event: Event | None,
        target: str | None,
    ) -> ExecuteResponse:
        request = ExecuteRequest(
            run_id=run_id,
            workflow_id=workflow_id,
            attempt=attempt,
            input=input,
            steps=list(steps),
            event=event,
            target_step=target,
        )
        self.requests.append(request)
        response = await self._execute(request)
        self.responses.append(response)
        if not response.opcodes:
            raise ProtocolError("execute answered with no opcodes")
        return response

    async def _run_planned(
        self,
        run_id: str,
        workflow_id: str,
        input: Any,
        steps: list[StepRecord],
        event: Event | None,
        planned: StepPlannedOp,
    ) -> StepRecord:
        attempt = 0
        while len(self.requests) < self.max_requests:
            response = await self._send(
                run_id, workflow_id, input, steps, attempt, event, planned.id
            )
            op = response.opcodes[0]
            if isinstance(op, StepErrorOp):
                attempt += 1
                continue
            if isinstance(op, StepRunOp | StepFailedOp):
                return await self._resolve(op)
            raise ProtocolError(f"target step {planned.name!r} answered {op!r}")
        raise ProtocolError(f"step {planned.name!r} did not end within the request bound")

    async def _resolve(self, op: Opcode) -> StepRecord:
        """The history record the engine writes for a step opcode."""
        if isinstance(op, StepRunOp | StepFailedOp | SleepOp):
            return step_record(op)
        if isinstance(op, WaitForEventOp):
            got = self.events.get(op.event)
            return step_record(op, result=None if got is None else msgspec.to_builtins(got))
        if isinstance(op, WaitForSignalOp):
            sig = self.signals.get(op.signal)
            return step_record(op, result=None if sig is None else msgspec.to_builtins(sig))
        if isinstance(op, InvokeOp):
            if self._invoke is None:
                raise ProtocolError(f"step {op.name!r} invokes {op.workflow!r}; no invoke= given")
            try:
                output = await self._invoke(op)
            except ChildFailed as failed:
                return step_record(op, error=failed.error)
            return step_record(op, result=output)
        raise ProtocolError(f"unexpected opcode among step opcodes: {op!r}")
