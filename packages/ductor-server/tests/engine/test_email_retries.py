"""The email loop's retries on both backends, on an injected clock: an SMTP
server that stays down gets the email after 1 s, 2 s, 4 s, ... and the 8th
failed try makes it failed, with the error; a refusal that is not retryable is
final at once. The waits are capped at five minutes."""

from __future__ import annotations

from datetime import timedelta
from itertools import pairwise

from ductor_core.runs import ErrorInfo
from ductor_server.engine.actions import ActionCall, ActionRegistry, failure
from ductor_server.engine.clock import ManualClock
from ductor_server.engine.emails import CONNECTION_HANDLER, EmailPolicy, EmailSender
from ductor_server.engine.notify import email_id, outbox_email
from ductor_server.engine.queue import InProcessWakeUp
from ductor_server.storage import Store
from ductor_server.storage.emails import Email, EmailStatus, EmailsTx

from .conftest import TENANT


class SmtpServer:
    """The SMTP server the connection reaches, as the email loop sees it: down
    (a retryable failure) or refusing the recipient (a final one)."""

    def __init__(self, clock: ManualClock, *, code: str, retryable: bool) -> None:
        self.clock = clock
        self.code = code
        self.retryable = retryable
        self.tries: list[tuple[int, float]] = []  # (attempt, when, as a timestamp)

    async def send(self, call: ActionCall) -> None:
        self.tries.append((call.attempt, self.clock.now().timestamp()))
        raise failure(self.code, "the SMTP server did not take it", retryable=self.retryable)


async def _queued(store: Store, clock: ManualClock) -> Email:
    row = outbox_email(
        tenant_id=TENANT,
        id=email_id(TENANT, "run_1:tell", "ann"),
        subscriber_id="ann",
        address="ann@example.com",
        connection="mail",
        subject="Shipped",
        title="Shipped",
        body="",
        ctas=[],
        now=clock.now(),
    )
    async with store.transaction() as tx:
        await EmailsTx(tx).insert([row])
    return row


async def _stored(store: Store, row: Email) -> Email:
    async with store.transaction() as tx:
        stored = await EmailsTx(tx).get(TENANT, row.id)
    assert stored is not None
    return stored


def _sender(store: Store, clock: ManualClock, smtp: SmtpServer) -> EmailSender:
    actions = ActionRegistry()
    actions.register(CONNECTION_HANDLER, smtp.send)
    return EmailSender(store, actions, clock=clock, wake=InProcessWakeUp())


async def test_a_server_that_stays_down_gets_eight_tries_doubling_from_one_second(
    store: Store,
) -> None:
    clock = ManualClock()
    smtp = SmtpServer(clock, code="smtp.connection", retryable=True)
    sender = _sender(store, clock, smtp)
    row = await _queued(store, clock)
    for _ in range(20):
        await sender.send_due()
        stored = await _stored(store, row)
        if stored.status is not EmailStatus.PENDING:
            break
        assert stored.next_at > clock.now()
        # Not a moment early: just before it is due, nothing is tried.
        clock.set(stored.next_at - timedelta(milliseconds=1))
        assert (await sender.send_due())[0] == 0
        clock.set(stored.next_at)
    assert [attempt for attempt, _ in smtp.tries] == [1, 2, 3, 4, 5, 6, 7, 8]
    times = [at for _, at in smtp.tries]
    waits = [round(b - a, 3) for a, b in pairwise(times)]
    assert waits == [1, 2, 4, 8, 16, 32, 64]
    assert (stored.status, stored.attempts) == (EmailStatus.FAILED, 8)
    assert stored.error is not None
    assert (stored.error["code"], stored.error["retryable"]) == ("smtp.connection", True)
    assert sender.failed == 1


async def test_a_refusal_that_is_not_retryable_is_final_at_once(store: Store) -> None:
    clock = ManualClock()
    smtp = SmtpServer(clock, code="smtp.recipient_refused", retryable=False)
    sender = _sender(store, clock, smtp)
    row = await _queued(store, clock)
    await sender.send_due()
    stored = await _stored(store, row)
    assert (stored.status, stored.attempts) == (EmailStatus.FAILED, 1)
    assert stored.error is not None
    assert stored.error["code"] == "smtp.recipient_refused"
    clock.advance(3600)
    assert (await sender.send_due())[0] == 0
    assert len(smtp.tries) == 1


def test_the_waits_between_tries_are_at_most_five_minutes() -> None:
    down = ErrorInfo(code="smtp.connection", message="down", retryable=True)
    policy = EmailPolicy()
    waits = [policy.delay(n, down) for n in range(1, 12)]
    assert waits == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    slow = ErrorInfo(code="smtp.temporary", message="4xx", retryable=True, retry_after_seconds=9999)
    assert policy.delay(1, slow) == 300
