"""Redis wake-ups between processes: a notify in one wakes the waiter of another,
not itself twice; a Redis restart (our own redis-server on a free port) costs
only the messages sent while it was down, and the listener comes back by itself
and wakes every topic once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from ductor_server.engine.queue import Topic
from ductor_server.engine.rediswake import RedisWakeUp

from .conftest import OwnRedis


@pytest.fixture
async def pair(own_redis: OwnRedis) -> AsyncIterator[tuple[RedisWakeUp, RedisWakeUp]]:
    clients = [Redis(port=own_redis.port, socket_connect_timeout=1) for _ in range(2)]
    first, second = (RedisWakeUp(c, prefix="t:") for c in clients)
    try:
        yield first, second
    finally:
        for wake in (first, second):
            await wake.aclose()
        for client in clients:
            await client.aclose()


async def _subscribed(*wakes: RedisWakeUp) -> None:
    async with asyncio.timeout(10):
        for wake in wakes:
            await wake.subscribed()


async def test_a_notify_wakes_the_other_process(pair: tuple[RedisWakeUp, RedisWakeUp]) -> None:
    first, second = pair
    await _subscribed(first, second)
    assert not await second.wait(Topic.TASKS, 0.05)
    first.notify(Topic.TASKS)
    assert await second.wait(Topic.TASKS, 5)
    assert not await second.wait(Topic.INBOX, 0.05)  # only the topic notified
    assert await first.wait(Topic.TASKS, 0)  # the notifier's own waiter, at once
    await asyncio.sleep(0.1)
    assert not await first.wait(Topic.TASKS, 0.05)  # and not again through Redis
    assert first.received == 0
    assert second.received == 1


async def test_wake_ups_resume_after_a_redis_restart(
    own_redis: OwnRedis, pair: tuple[RedisWakeUp, RedisWakeUp]
) -> None:
    first, second = pair
    await _subscribed(first, second)
    own_redis.stop()
    first.notify(Topic.TIMERS)  # lost: nobody can hear it, and nothing fails
    own_redis.start()
    # Back on its own; having missed messages, the listener wakes every topic once.
    assert await second.wait(Topic.INBOX, 15)
    await _subscribed(first, second)
    for topic in Topic:
        await second.wait(topic, 0)
    first.notify(Topic.TASKS)
    assert await second.wait(Topic.TASKS, 5)
