"""Wake-ups across processes through Redis pub/sub.

A notify wakes this process's waiter at once and publishes the topic; every
process listening on the channel wakes its own waiter. Redis carries no work
here: a lost message (Redis down, a reconnect) costs latency until the loops'
slow poll, never a task; after a reconnect every topic is woken once, since a
message may have been missed meanwhile.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis

from ductor_server.engine.queue import InProcessWakeUp, Topic
from ductor_server.engine.redischannel import RedisChannel

log = logging.getLogger("ductor.wakeup")


class RedisWakeUp(RedisChannel[Topic]):
    """A `WakeUp` shared by every process on one Redis (channel `<prefix>wake`)."""

    def __init__(self, redis: Redis, *, prefix: str = "ductor:") -> None:
        super().__init__(redis, f"{prefix}wake", log=log, name="wake", max_backoff=5.0)
        self.received = 0  # messages from other processes
        self._local = InProcessWakeUp()

    def notify(self, topic: Topic) -> None:
        """Wake this process's waiter of `topic` and tell the other processes."""
        self._local.notify(topic)
        self.publish((topic,))

    async def wait(self, topic: Topic, within: float) -> bool:
        """Sleep until `topic` is notified here or elsewhere, or `within` seconds pass."""
        self.start()
        return await self._local.wait(topic, within)

    def encode(self, items: list[Topic]) -> str:
        """`<origin> <topic>,<topic>...`."""
        return f"{self.origin} {','.join(items)}"

    def on_gap(self) -> None:
        """Wake every topic once: a message may have been missed."""
        for topic in Topic:
            self._local.notify(topic)

    def on_message(self, data: object) -> None:
        """Wake the topics another process notified."""
        text = data.decode() if isinstance(data, bytes) else str(data)
        origin, _, names = text.partition(" ")
        if origin == self.origin:
            return
        self.received += 1
        known = {topic.value for topic in Topic}
        for name in names.split(","):
            if name in known:
                self._local.notify(Topic(name))


__all__ = ["RedisWakeUp"]
