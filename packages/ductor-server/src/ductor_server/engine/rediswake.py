"""Wake-ups across processes through Redis pub/sub.

A notify wakes this process's waiter at once and publishes the topic; every
process listening on the channel wakes its own waiter. Redis carries no work
here: a lost message (Redis down, a reconnect) costs latency until the loops'
slow poll, never a task; after a reconnect every topic is woken once, since a
message may have been missed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from ductor_server.engine.queue import InProcessWakeUp, Topic

log = logging.getLogger("ductor.wakeup")


class ReconnectingPubSub(PubSub):
    """A subscription that calls `on_reconnect` whenever redis-py reconnects it by
    itself (it resubscribes, but messages sent meanwhile are lost). redis-py
    registers `on_connect` on an already connected connection, so it only runs
    on reconnects."""

    def __init__(
        self,
        pool: ConnectionPool,
        *,
        ignore_subscribe_messages: bool,
        on_reconnect: Callable[[], None],
    ) -> None:
        super().__init__(pool, ignore_subscribe_messages=ignore_subscribe_messages)
        self._on_reconnect = on_reconnect

    async def on_connect(self, connection: Any) -> None:
        """Resubscribe, then report the reconnect."""
        await super().on_connect(connection)
        self._on_reconnect()


class RedisWakeUp:
    """A `WakeUp` shared by every process on one Redis (channel `<prefix>wake`)."""

    def __init__(self, redis: Redis, *, prefix: str = "ductor:") -> None:
        self.redis = redis
        self.channel = f"{prefix}wake"
        self.origin = uuid.uuid4().hex[:12]  # our own messages are not news to us
        self.published = 0  # messages sent
        self.received = 0  # messages from other processes
        self._local = InProcessWakeUp()
        self._pending: set[Topic] = set()
        self._publisher: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._subscribed = asyncio.Event()

    def notify(self, topic: Topic) -> None:
        """Wake this process's waiter of `topic` and tell the other processes."""
        self._local.notify(topic)
        self._pending.add(topic)
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.get_running_loop().create_task(
                self._publish(), name="ductor-wake-publish"
            )

    async def wait(self, topic: Topic, within: float) -> bool:
        """Sleep until `topic` is notified here or elsewhere, or `within` seconds pass."""
        self.start()
        return await self._local.wait(topic, within)

    def start(self) -> None:
        """Start listening (done by the first `wait`; idempotent)."""
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name="ductor-wake-listen"
            )

    async def subscribed(self) -> None:
        """Wait until the listener is subscribed (for tests and start-up; bound it
        with `asyncio.timeout`)."""
        self.start()
        await self._subscribed.wait()

    async def aclose(self) -> None:
        """Stop listening and publishing."""
        for task in (self._listener, self._publisher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._listener = self._publisher = None

    async def _publish(self) -> None:
        while self._pending:
            topics = sorted(self._pending)
            self._pending.clear()
            try:
                await self.redis.publish(self.channel, f"{self.origin} {','.join(topics)}")
                self.published += 1
            except RedisError as exc:
                log.warning("could not publish a wake-up (%s): other processes poll", exc)
                return

    async def _listen(self) -> None:
        failures = 0
        while True:
            pubsub = ReconnectingPubSub(
                self.redis.connection_pool,
                ignore_subscribe_messages=True,
                on_reconnect=self._wake_all,
            )
            try:
                await pubsub.subscribe(self.channel)
                if failures:
                    self._wake_all()
                failures = 0
                self._subscribed.set()
                while True:
                    message = await pubsub.get_message(timeout=None)
                    if message is not None:
                        self._deliver(message.get("data"))
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                failures += 1
                self._subscribed.clear()
                log.warning("wake-up channel lost (%s); retrying (%d)", exc, failures)
                await asyncio.sleep(min(0.1 * 2**failures, 5.0))
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    def _wake_all(self) -> None:
        for topic in Topic:
            self._local.notify(topic)

    def _deliver(self, data: object) -> None:
        text = data.decode() if isinstance(data, bytes) else str(data)
        origin, _, names = text.partition(" ")
        if origin == self.origin:
            return
        self.received += 1
        known = {topic.value for topic in Topic}
        for name in names.split(","):
            if name in known:
                self._local.notify(Topic(name))


__all__ = ["ReconnectingPubSub", "RedisWakeUp"]
