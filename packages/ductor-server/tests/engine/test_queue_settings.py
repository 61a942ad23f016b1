"""The queue's settings: the poll interval follows what wake-ups can reach, and
`DUCTOR_FAIRNESS` is decoded at start, refusing a bad policy with its pointer."""

from __future__ import annotations

from pathlib import Path

import pytest

from ductor_server.composition import build
from ductor_server.engine.fairqueue import LocalFairQueue
from ductor_server.engine.redisqueue import RedisFairQueue
from ductor_server.engine.rediswake import RedisWakeUp
from ductor_server.settings import (
    DEFAULT_WORKER_CONCURRENCY,
    IDLE_POLL_INTERVAL,
    MAX_WORKER_CONCURRENCY,
    SPLIT_POLL_INTERVAL,
    Settings,
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "DUCTOR_POLL_INTERVAL",
        "DUCTOR_REDIS_URL",
        "DUCTOR_ROLES",
        "DUCTOR_FAIRNESS",
        "DUCTOR_OPERATOR_KEY",
        "DUCTOR_WORKER_CONCURRENCY",
    ):
        monkeypatch.delenv(name, raising=False)


def test_the_poll_interval_is_slow_only_where_wake_ups_reach_every_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.from_env().engine_poll_interval == IDLE_POLL_INTERVAL
    monkeypatch.setenv("DUCTOR_ROLES", "coordinator,worker")
    assert Settings.from_env().engine_poll_interval == SPLIT_POLL_INTERVAL
    monkeypatch.setenv("DUCTOR_REDIS_URL", "redis://127.0.0.1:1/0")
    assert Settings.from_env().engine_poll_interval == IDLE_POLL_INTERVAL
    monkeypatch.setenv("DUCTOR_POLL_INTERVAL", "0.25")
    assert Settings.from_env().engine_poll_interval == 0.25


def test_the_fairness_policy_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DUCTOR_FAIRNESS", '{"tenants": {"t1": {"weight": 3, "max_running": 2}}}')
    settings = Settings.from_env()
    assert settings.fairness.of("t1").weight == 3
    monkeypatch.setenv("DUCTOR_FAIRNESS", '{"tenants": {"t1": {"weight": 0}}}')
    with pytest.raises(ValueError, match="/tenants/t1/weight"):
        Settings.from_env()


def test_the_composition_wires_the_fair_queue_and_redis_wake_ups(tmp_path: Path) -> None:
    plain = build(Settings(data_dir=tmp_path, cel_sandbox=False))
    assert isinstance(plain.runtime.queue, LocalFairQueue)
    assert plain.redis is None
    redis = build(Settings(data_dir=tmp_path, cel_sandbox=False, redis_url="redis://127.0.0.1:1/0"))
    assert isinstance(redis.runtime.wakeup, RedisWakeUp)
    assert isinstance(redis.runtime.queue, RedisFairQueue)
    assert redis.runtime.config.poll_interval == IDLE_POLL_INTERVAL


def test_the_worker_slots_come_from_the_environment_and_size_the_fair_queue(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert Settings.from_env().worker_concurrency == DEFAULT_WORKER_CONCURRENCY
    monkeypatch.setenv("DUCTOR_WORKER_CONCURRENCY", "12")
    settings = Settings.from_env()
    assert settings.worker_concurrency == 12
    for redis_url in (None, "redis://127.0.0.1:1/0"):
        runtime = build(
            Settings(
                data_dir=tmp_path, cel_sandbox=False, redis_url=redis_url, worker_concurrency=12
            )
        ).runtime
        assert runtime.workers.concurrency == 12
        queue = runtime.queue
        assert isinstance(queue, LocalFairQueue | RedisFairQueue)
        assert queue.capacity == 12  # the queue shares out the same slots
    for bad in ("0", "-3", "many", "2.5", str(MAX_WORKER_CONCURRENCY + 1)):
        monkeypatch.setenv("DUCTOR_WORKER_CONCURRENCY", bad)
        with pytest.raises(ValueError, match="DUCTOR_WORKER_CONCURRENCY must be a whole number"):
            Settings.from_env()


def test_the_operator_key_comes_from_the_environment_and_is_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.from_env().operator_key is None
    monkeypatch.setenv("DUCTOR_OPERATOR_KEY", "op-" + "s" * 30)
    settings = Settings.from_env()
    assert settings.operator_key == "op-" + "s" * 30
    assert "sssss" not in repr(settings)
    monkeypatch.setenv("DUCTOR_OPERATOR_KEY", "short")
    with pytest.raises(ValueError, match="at least 32"):
        Settings.from_env()


def test_the_redis_queue_chooses_by_the_same_rules_while_redis_is_away(tmp_path: Path) -> None:
    built = build(Settings(data_dir=tmp_path, cel_sandbox=False, redis_url="redis://127.0.0.1:1/0"))
    queue = built.runtime.queue
    assert isinstance(queue, RedisFairQueue)
    assert queue._fallback.shared
    assert queue._fallback.policies is queue.policies
