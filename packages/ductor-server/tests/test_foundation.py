"""The service starts, answers health checks, and its CLI and fixtures work."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
import redis
from litestar.testing import AsyncTestClient

from ductor_server import Settings, __version__, create_app
from ductor_server.cli import main


async def test_healthz_answers_ok(tmp_path: Path) -> None:
    async with AsyncTestClient(app=create_app(Settings(data_dir=tmp_path))) as client:
        response = await client.get("/healthz")
        ready = await client.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert ready.status_code == 200
    assert ready.json()["checks"]["store"] == "ok"


def test_cli_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ductor {__version__}"


def test_each_test_gets_its_own_postgres_database(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    assert row[0].startswith("ductor_t_")
    assert postgres_url.endswith(row[0])


def test_redis_prefix_is_private(redis_url: str, redis_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set(f"{redis_prefix}k", b"v")
    assert client.get(f"{redis_prefix}k") == b"v"
    client.close()


def test_an_error_body_repeats_at_most_a_bounded_part_of_what_was_sent() -> None:
    from ductor_server.errors import RequestInvalid, WorkflowNotFound, bounded
    from ductor_server.services.tools import error_body

    body = error_body(WorkflowNotFound("s" * 100_000))
    assert body["code"] == "workflow.not_found"
    assert body["details"] == {"family_slug": "s" * 974 + "… (99026 more characters)"}
    assert body["message"] == "workflow '" + "s" * 1_964 + "… (98047 more characters)"
    assert len(body["message"]) <= 2_000
    nested = RequestInvalid("x", details=[{"pointer": "/a", "message": "m" * 1_001}, 7, None])
    assert error_body(nested)["details"] == [
        {"pointer": "/a", "message": "m" * 976 + "… (25 more characters)"},
        7,
        None,
    ]
    assert bounded(body["message"], body["details"]) == (body["message"], body["details"])
    short = error_body(WorkflowNotFound("hello"))
    assert short == {
        "code": "workflow.not_found",
        "message": "workflow 'hello' not found",
        "details": {"family_slug": "hello"},
    }


async def test_readyz_names_a_check_that_does_not_answer_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from ductor_server.transports.rest import health

    monkeypatch.setattr(health, "READY_TIMEOUT_SECONDS", 0.05)
    app = create_app(Settings(data_dir=tmp_path))
    async with AsyncTestClient(app=app) as client:

        async def hangs() -> None:
            await asyncio.sleep(10)

        monkeypatch.setattr(app.state.composition.store, "ping", hangs)
        ready = await client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["status"] == "unavailable"
    assert ready.json()["checks"]["store"] == "error: no answer within 0.05 s"
