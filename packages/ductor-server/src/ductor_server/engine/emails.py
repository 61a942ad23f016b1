"""The email loop: sends the inbox's outbox emails (`inbox_emails`) through the
tenant's SMTP connection, with retries, and records each final outcome.

A send goes through the same step handler ACTION steps use for connections (the
registry's `connection` handler: tenant-scoped load, secrets decrypted, the
outbound guard, redacted errors), with the email's id as the idempotency key,
which the `smtp` provider turns into the Message-ID. A row is claimed (a lease)
in one transaction and settled in another, fenced by its attempt number: a crash
before the send loses nothing (the row is still due), and a crash after the SMTP
server took the message but before the settle sends it again, after the lease,
with the same Message-ID. Runs in the worker role; holds no state of its own.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ductor_core.runs import ErrorInfo
from ductor_server.engine.actions import ActionCall, ActionFailed, ActionRegistry
from ductor_server.engine.clock import Clock
from ductor_server.engine.notify import EMAIL_OPERATION
from ductor_server.engine.queue import Topic, WakeUp
from ductor_server.storage.emails import Email, EmailStatus, EmailsTx
from ductor_server.storage.protocol import Store
from ductor_server.storage.records import NewHistoryEntry

log = logging.getLogger("ductor.emails")

CONNECTION_HANDLER = "connection"
"""The registry's handler for calls through a tenant's connection."""


@dataclass(frozen=True, kw_only=True)
class EmailPolicy:
    """How the email loop retries.

    Attributes:
        max_attempts: sends tried before a retryable failure becomes final.
        first_delay: seconds before the first retry; each later one doubles it.
        max_delay: the longest wait between two tries.
        send_timeout: seconds one send may take.
        lease_seconds: how long a claimed email is this process's before another
            may take it (longer than `send_timeout`).
        batch: emails claimed per turn.
    """

    max_attempts: int = 8
    first_delay: float = 1.0
    max_delay: float = 300.0
    send_timeout: float = 60.0
    lease_seconds: float = 120.0
    batch: int = 32

    def delay(self, attempts: int, error: ErrorInfo) -> float:
        """Seconds before the next try after `attempts` tries (a server's own
        `retry_after_seconds` wins when it is longer)."""
        wait = min(self.first_delay * 2.0 ** max(attempts - 1, 0), self.max_delay)
        asked = float(error.retry_after_seconds or 0.0)
        return max(wait, min(asked, self.max_delay))


class EmailSender:
    """Claims due outbox emails, sends them, settles them; sleeps until the next is due."""

    def __init__(
        self,
        store: Store,
        actions: ActionRegistry,
        *,
        clock: Clock,
        wake: WakeUp,
        poll_interval: float = 0.5,
        policy: EmailPolicy | None = None,
    ) -> None:
        self.store = store
        self.actions = actions
        self.clock = clock
        self.wake = wake
        self.poll_interval = poll_interval
        self.policy = policy or EmailPolicy()
        self.stopped = False
        self.sent = 0  # emails sent since start
        self.failed = 0  # emails given up since start

    async def run_forever(self) -> None:
        """Send due emails until cancelled."""
        failures = 0
        while not self.stopped:
            try:
                taken, next_at = await self.send_due()
                failures = 0
                if taken >= self.policy.batch:
                    continue
            except asyncio.CancelledError:
                raise
            except Exception:
                failures += 1
                log.exception("sending inbox emails failed (%d in a row)", failures)
                await asyncio.sleep(min(0.05 * 2**failures, 5.0))
                continue
            sleep = self.poll_interval
            if next_at is not None:
                sleep = min(max((next_at - self.clock.now()).total_seconds(), 0.0), sleep)
            await self.wake.wait(Topic.EMAIL, sleep)

    async def send_due(self) -> tuple[int, datetime | None]:
        """Claim and send the due emails of one turn, at once; return how many were
        claimed and when the next one is due."""
        now = self.clock.now()
        lease_until = now + timedelta(seconds=self.policy.lease_seconds)
        claimed: list[Email] = []
        next_at: datetime | None = None
        async with self.store.transaction() as tx:
            outbox = EmailsTx(tx)
            due = await outbox.due(now, limit=self.policy.batch)
            for tenant_id, email_id in due:
                email = await outbox.claim(tenant_id, email_id, now=now, lease_until=lease_until)
                if email is not None:
                    claimed.append(email)
            if not due:  # an idle turn is one transaction
                next_at = await outbox.next_due_at()
        if claimed:
            await asyncio.gather(*(self._send(email) for email in claimed))
            next_at = now  # look again at once: more may have come due meanwhile
        return len(claimed), next_at

    async def _send(self, email: Email) -> None:
        call = ActionCall(
            tenant_id=email.tenant_id,
            run_id=email.run_id or "",
            step_ref=email.step_ref or "",
            attempt=email.attempts,
            handler=CONNECTION_HANDLER,
            step_type="inbox.email",
            payload={
                "connection": email.connection,
                "operation": EMAIL_OPERATION,
                "input": {
                    "to": [email.to_address],
                    "subject": email.subject,
                    "text": email.text_body,
                },
            },
            idempotency_key=email.id,
            timeout_seconds=self.policy.send_timeout,
        )
        output: Any = None
        error: ErrorInfo | None = None
        try:
            output = await self.actions.run(call)
        except ActionFailed as exc:
            error = exc.error
        except Exception as exc:  # a handler bug: retried like a crash
            error = ErrorInfo(
                code="provider.crashed", message=f"{type(exc).__name__}", retryable=True
            )
        await self._settle(email, output, error)

    async def _settle(self, email: Email, output: Any, error: ErrorInfo | None) -> None:
        now = self.clock.now()
        entry: NewHistoryEntry | None = None
        if error is None:
            message_id = output.get("message_id") if isinstance(output, dict) else None
            status, next_at, detail = EmailStatus.SENT, None, None
        else:
            message_id = None
            detail = {"code": error.code, "message": error.message, "retryable": error.retryable}
            final = not error.retryable or email.attempts >= self.policy.max_attempts
            status = EmailStatus.FAILED if final else EmailStatus.PENDING
            next_at = (
                None if final else now + timedelta(seconds=self.policy.delay(email.attempts, error))
            )
        if status is not EmailStatus.PENDING and email.run_id:
            data: dict[str, Any] = {
                "step_ref": email.step_ref,
                "email_id": email.id,
                "subscriber_id": email.subscriber_id,
                "status": status.value,
                "attempts": email.attempts,
            }
            if message_id is not None:
                data["message_id"] = message_id
            if detail is not None:
                data["error"] = detail
            entry = NewHistoryEntry(
                tenant_id=email.tenant_id,
                run_id=email.run_id,
                at=now,
                kind="notify.email",
                data=data,
            )
        async with self.store.transaction() as tx:
            ours = await EmailsTx(tx).settle(
                email,
                status=status,
                now=now,
                next_at=next_at,
                message_id=message_id,
                error=detail,
            )
            if ours and entry is not None:
                await tx.append_history([entry])
        if not ours:
            log.warning("inbox email %s was claimed again before its send settled", email.id)
        elif status is EmailStatus.SENT:
            self.sent += 1
        elif status is EmailStatus.FAILED:
            self.failed += 1
            log.info("inbox email %s failed: %s", email.id, detail)


__all__ = ["CONNECTION_HANDLER", "EmailPolicy", "EmailSender"]
