"""The `bridge` step handler: one signed execute call to an app's endpoint, or, for
a DAG `STEP_TYPE_BRIDGE` step, a child bridge run awaited to its end.

Run by the step workers; it never writes the state of the run it works for.
For an execute it returns the app's opcodes as the attempt's output (the
bridge tick applies them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx
import msgspec
from opentelemetry import trace

from ductor.errors import ProtocolError, SignatureError
from ductor.protocol import (
    INLINE_LIMIT_BYTES,
    SIGNATURE_HEADER,
    CancelRequest,
    CancelResponse,
    ErrorResponse,
    ExecuteRequest,
    ExecuteResponse,
    SigningKeys,
    decode,
    encode,
)
from ductor_core.runs import ErrorInfo, RunStatus
from ductor_server.bridge.keys import BridgeKeys, keys_for_app, signing_keys_from_env
from ductor_server.bridge.registry import get_app, get_workflow, touch_app
from ductor_server.bridge.runs import create_bridge_run
from ductor_server.bridge.tick import opcode_problems
from ductor_server.engine.actions import ActionCall, ActionFailed, failure
from ductor_server.engine.catalog import WorkflowCatalog
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.effects import Effects, EngineParts
from ductor_server.engine.outbound import (
    MAX_RESPONSE_BYTES,
    OutboundForbidden,
    OutboundPolicy,
    guarded_transport,
    read_capped,
)
from ductor_server.engine.queue import WakeUp
from ductor_server.storage.protocol import Store
from ductor_server.telemetry import client_span, current_traceparent, inject_headers

log = logging.getLogger("ductor.bridge")

TOUCH_EVERY_SECONDS = 30.0
"""How often (at most) a successful call refreshes the app's `last_seen_at`."""


class BridgeDriver:
    """Calls the app that hosts a run's workflow with an `execute` request.

    Args:
        store: where the app registry lives.
        keys: the server-wide bridge signing keys, for apps with no keys of their
            own; read from the environment when None. An app with keys of its
            own is called with those (its tenant's), never with these.
        clock: the clock for signatures and `last_seen_at`.
        timeout: seconds one call may take.
        transport: an httpx transport (tests); a real connection pool when None.
        wake: the engine's wake-up, to start child runs (DAG BRIDGE steps) promptly.
        poll_interval: seconds between looks at a child run a DAG BRIDGE step awaits.
        parts: the runtime's engine parts, for starting those child runs.
        policy: the outbound guard app URLs must pass (none: unguarded).
    """

    def __init__(
        self,
        store: Store,
        *,
        keys: SigningKeys | None = None,
        clock: Clock | None = None,
        timeout: float = 120.0,
        transport: httpx.AsyncBaseTransport | None = None,
        keys_loader: Callable[[], SigningKeys | None] = signing_keys_from_env,
        wake: WakeUp | None = None,
        poll_interval: float = 0.2,
        parts: EngineParts | None = None,
        policy: OutboundPolicy | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.wake = wake
        self.poll_interval = poll_interval
        self.parts = parts or EngineParts(catalog=WorkflowCatalog())
        self.keys = keys if keys is not None else keys_loader()
        self.server_keys = None if self.keys is None else BridgeKeys.server(self.keys)
        self.clock = clock or SystemClock()
        self.timeout = timeout
        self.transport = transport
        self._http: httpx.AsyncClient | None = None
        self._touched: dict[tuple[str, str], float] = {}
        self.calls = 0  # execute calls sent (for tests and benchmarks)

    async def aclose(self) -> None:
        """Close the connection pool (it reopens on next use)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(
                transport=self.transport or guarded_transport(self.policy),
                timeout=self.timeout,
                trust_env=self.policy is None,
            )
        return self._http

    async def __call__(self, call: ActionCall) -> Any:
        payload = call.payload if isinstance(call.payload, dict) else {}
        raw_request = payload.get("request")
        if raw_request is None and payload.get("cancel") is None:
            return await self._drive_child(call, payload)
        app_id = str(payload.get("app_id"))
        async with self.store.transaction() as tx:
            app = await get_app(tx, call.tenant_id, app_id)
            keys = await keys_for_app(
                tx, call.tenant_id, app_id, now=self.clock.now(), server=self.server_keys
            )
        if keys is None:
            raise failure(
                "handler.unavailable",
                f"app {app_id!r} has no signing key and the server none:"
                " create one (POST /v1/bridge/apps/{app_id}/keys) or set DUCTOR_BRIDGE_SIGNING_KEY",
                retryable=False,
            )
        if not keys.sign_with:
            raise failure(
                "bridge.no_signing_key",
                f"every signing key of app {app_id!r} is revoked or expired: create a new one",
                retryable=False,
            )
        if app is None or not app.url:
            raise failure(
                "app.not_found",
                f"app {app_id!r} is not registered (or has no URL): POST /v1/bridge/sync",
                retryable=True,
            )
        if raw_request is None:
            cancel = msgspec.convert(payload["cancel"], CancelRequest)
            raw = await self._call_app(
                call, app_id, app.url, "cancel", lambda: encode(cancel), keys
            )
            try:
                cancelled = decode(raw, CancelResponse)
            except ProtocolError as exc:
                raise failure("bridge.bad_response", exc.message, retryable=False) from None
            return msgspec.to_builtins(cancelled)
        request = msgspec.convert(raw_request, ExecuteRequest)

        def execute_body() -> bytes:
            # The signed body names the bridge call's span too, for `ctx.traceparent`.
            traced = msgspec.structs.replace(request, traceparent=current_traceparent())
            body = encode(traced)
            if len(body) > INLINE_LIMIT_BYTES:
                traced = msgspec.structs.replace(
                    traced,
                    input=None,
                    steps=[],
                    event=None,
                    payload_ref=f"{call.run_id}:{call.attempt}",
                )
                body = encode(traced)
            return body

        content = await self._call_app(call, app_id, app.url, "execute", execute_body, keys)
        try:
            answer = decode(content, ExecuteResponse)
        except ProtocolError as exc:
            raise failure("bridge.bad_response", exc.message, retryable=False) from None
        problems = opcode_problems(answer.opcodes)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            message = f"the app's answer, at {first['pointer']}: {first['message']}{more}"
            raise failure("bridge.bad_response", message, retryable=False)
        await self._touch(call.tenant_id, app_id)
        return {"opcodes": msgspec.to_builtins(answer.opcodes)}

    async def _call_app(
        self,
        call: ActionCall,
        app_id: str,
        url: str,
        action: str,
        body: Callable[[], bytes],
        keys: BridgeKeys,
    ) -> bytes:
        """One call to the app as a `ductor.bridge.call` CLIENT span, whose context
        the request carries (`traceparent` header, and in an execute's body)."""
        target = httpx.URL(url)
        with client_span(
            "ductor.bridge.call",
            {
                "ductor.bridge.app_id": app_id,
                "ductor.bridge.action": action,
                "ductor.run_id": call.run_id,
                "ductor.step_ref": call.step_ref,
                "http.request.method": "POST",
                "server.address": target.host,
                "server.port": target.port or (443 if target.scheme == "https" else 80),
            },
        ):
            return await self._post(call, app_id, url, body(), keys)

    async def _post(
        self, call: ActionCall, app_id: str, url: str, body: bytes, keys: BridgeKeys
    ) -> bytes:
        """POST a body signed with the app's keys (a fresh nonce); return its verified
        2xx answer."""
        now = int(self.clock.now().timestamp())
        headers = {
            SIGNATURE_HEADER: keys.request_header(body, now=now),
            "content-type": "application/json",
            "Idempotency-Key": call.idempotency_key,
        }
        inject_headers(headers)  # whatever the transport
        self.calls += 1
        try:
            async with self._client().stream(
                "POST", url, content=body, headers=headers
            ) as response:
                content = await read_capped(response)
            trace.get_current_span().set_attribute(
                "http.response.status_code", response.status_code
            )
        except OutboundForbidden as exc:
            raise failure(
                "outbound.forbidden", str(exc), retryable=False, details={"host": exc.host}
            ) from exc
        except httpx.HTTPError as exc:
            raise failure(
                "bridge.unreachable", f"POST {url} failed: {exc!r}", retryable=True
            ) from exc
        if content is None:
            raise failure(
                "bridge.answer_too_large",
                f"app {app_id!r} answered more than {MAX_RESPONSE_BYTES} bytes"
                " (large outputs go by reference)",
                retryable=False,
            )
        answered = int(self.clock.now().timestamp())
        try:
            keys.verify(content, response.headers.get(SIGNATURE_HEADER), now=answered)
        except SignatureError as exc:
            raise failure(
                exc.code,
                f"the answer of app {app_id!r} failed verification: {exc.message}"
                f" (HTTP {response.status_code})",
                retryable=False,
            ) from None
        if response.status_code >= 400:
            raise self._refused(app_id, response, content)
        return content

    def _refused(self, app_id: str, response: httpx.Response, content: bytes) -> Exception:
        try:
            error = decode(content, ErrorResponse)
            code, message, retryable = error.code, error.message, error.retryable
        except ProtocolError:
            code, message = "bridge.call_failed", content[:500].decode("utf-8", "replace")
            retryable = False
        retryable = retryable or response.status_code >= 500 or response.status_code == 429
        return failure(
            code,
            f"app {app_id!r} answered HTTP {response.status_code}: {message}",
            retryable=retryable,
        )

    async def _drive_child(self, call: ActionCall, payload: dict[str, Any]) -> Any:
        """A DAG `STEP_TYPE_BRIDGE` step: start the SDK workflow as a child run of the
        step's run (once per attempt, by child key) and wait for it to end.

        A redelivered attempt finds the child already started and waits for it.
        """
        app_id, workflow_id = str(payload.get("app_id")), str(payload.get("workflow"))
        child_key = f"{call.run_id}:{call.step_ref}:{call.item_index}:{call.attempt}"
        effects = Effects()
        async with self.store.transaction() as tx:
            workflow = await get_workflow(tx, call.tenant_id, app_id, workflow_id)
            parent = await tx.get_run(call.tenant_id, call.run_id)
            if workflow is None:
                raise failure(
                    "workflow.not_found",
                    f"app {app_id!r} has no registered workflow {workflow_id!r}",
                    retryable=False,
                )
            if parent is None:
                raise failure("run.not_found", f"run {call.run_id} is gone", retryable=False)
            inserted = await create_bridge_run(
                tx,
                self.parts,
                effects,
                tenant_id=call.tenant_id,
                workflow=workflow,
                input=payload.get("input"),
                now=self.clock.now(),
                # The parent is named (so cancelling it cancels the child) without a
                # step ref: the DAG tick hears of the child's end through this attempt.
                parent=parent,
                child_key=child_key,
            )
            await effects.flush(tx)
        if self.wake is not None:
            effects.notify(self.wake)
        child_id = inserted.run.id
        while True:
            async with self.store.transaction() as tx:
                child = await tx.get_run(call.tenant_id, child_id)
            if child is None:
                raise failure("run.not_found", f"child run {child_id} is gone", retryable=False)
            if child.status.terminal:
                break
            await asyncio.sleep(self.poll_interval)
        if child.status == RunStatus.SUCCEEDED:
            return child.state.output
        error = child.state.error
        raise ActionFailed(
            ErrorInfo(
                code=error.code if error is not None else "run.failed",
                message=f"bridge run {child_id}: "
                + (error.message if error is not None else child.status.value),
                retryable=False,
                details={"child_run_id": child_id},
            )
        )

    async def _touch(self, tenant_id: str, app_id: str) -> None:
        key = (tenant_id, app_id)
        moment = time.monotonic()
        if moment - self._touched.get(key, -TOUCH_EVERY_SECONDS) < TOUCH_EVERY_SECONDS:
            return
        self._touched[key] = moment
        try:
            async with self.store.transaction() as tx:
                await touch_app(tx, tenant_id, app_id, now=self.clock.now())
        except Exception:  # last_seen_at is advisory: never fail the attempt for it
            log.exception("could not record that app %s answered", app_id)


__all__ = ["TOUCH_EVERY_SECONDS", "BridgeDriver"]
