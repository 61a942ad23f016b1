"""The typed REST API client, sync and async, against a real local HTTP server."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ductor import ApiError
from ductor.api import ApiClient, AsyncApiClient, EventAccepted, Run, RunStatus

API_KEY = "api-key-test"


def test_sync_client_triggers_reads_waits_signals_and_cancels(fake_server: Any) -> None:
    with ApiClient(fake_server.url, api_key=API_KEY) as api:
        run = api.trigger("charge-order", {"id": 1}, version=3, idempotency_key="k-1")
        assert isinstance(run, Run)
        assert (run.id, run.status, run.version, run.done) == (
            "run-1",
            RunStatus.PENDING,
            3,
            False,
        )
        again = api.trigger("charge-order", {"id": 1}, idempotency_key="k-1")
        assert again.id == run.id  # the key dedupes
        done = api.wait_for_result(run.id, timeout=5, interval=0.01)
        assert done.succeeded
        assert done.output == {"echo": {"id": 1}}
        # Each read asked the server to hold it until the run ends (at most the
        # time left); this fake answers at once, so the client paused between.
        asked = [float(w) for w in fake_server.waits if w is not None]
        assert len(asked) == 2
        assert all(0 < w <= 5 for w in asked)
        accepted = api.send_event("order.created", {"id": 1}, id="evt-1")
        assert accepted == EventAccepted(id="evt-1", name="order.created")
        api.signal(run.id, "approve", {"by": "ops"})
        other = api.trigger("charge-order", None)
        api.cancel(other.id)
        assert api.get_run(other.id).status == RunStatus.CANCELLED
    assert fake_server.events == [{"name": "order.created", "data": {"id": 1}, "id": "evt-1"}]
    assert fake_server.signals == [("run-1", "approve", {"by": "ops"})]


def test_sync_client_errors_are_typed(fake_server: Any) -> None:
    with ApiClient(fake_server.url, api_key=API_KEY) as api:
        with pytest.raises(ApiError) as info:
            api.get_run("missing")
        assert (info.value.status, info.value.code) == (404, "run.not_found")
        assert "missing" in info.value.message
        with pytest.raises(ApiError) as info:
            api.signal("missing", "x")
        assert info.value.code == "run.not_found"
    with ApiClient(fake_server.url, api_key="wrong") as api:
        with pytest.raises(ApiError) as info:
            api.trigger("x")
        assert (info.value.status, info.value.code, info.value.retryable) == (
            401,
            "auth.invalid",
            False,
        )


def test_wait_for_result_times_out(fake_server: Any) -> None:
    fake_server.gets_until_done = 10_000
    ticks = iter(range(100))
    with ApiClient(fake_server.url, api_key=API_KEY) as api:
        run = api.trigger("slow")
        with pytest.raises(TimeoutError, match="RUN_STATUS_PENDING"):
            api.wait_for_result(run.id, timeout=3, interval=0, clock=lambda: next(ticks))


_WAIT_LIMIT = b'{"code":"run.wait_limit","message":"too many requests wait for runs"}'


def _busy_then_done(asked: list[str], busy: int) -> httpx.MockTransport:
    """A server whose tenant has too many waiting requests for `busy` answers."""

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(str(request.url))
        if len(asked) <= busy:
            return httpx.Response(429, content=_WAIT_LIMIT)
        return httpx.Response(200, json={"id": "run-1", "status": "RUN_STATUS_SUCCEEDED"})

    return httpx.MockTransport(answer)


def test_wait_for_result_asks_again_while_the_server_is_too_busy_to_wait() -> None:
    """A 429 run.wait_limit was raised as an ApiError, ending the wait on a run that
    was still going: it is an answer at once, after which the client pauses and asks
    again, until its deadline."""
    asked: list[str] = []
    transport = _busy_then_done(asked, busy=2)
    with ApiClient("http://ductor.test", api_key=API_KEY, transport=transport) as api:
        assert api.wait_for_result("run-1", timeout=5, interval=0).succeeded
    assert len(asked) == 3
    ticks = iter(range(100))
    transport = _busy_then_done([], busy=10_000)
    api = ApiClient("http://ductor.test", api_key=API_KEY, transport=transport)
    with api, pytest.raises(TimeoutError, match="429"):
        api.wait_for_result("run-1", timeout=3, interval=0, clock=lambda: next(ticks))


async def test_the_async_wait_asks_again_while_the_server_is_too_busy_to_wait() -> None:
    asked: list[str] = []
    sync_transport = _busy_then_done(asked, busy=2)

    async def handler(request: httpx.Request) -> httpx.Response:
        return sync_transport.handle_request(request)

    transport = httpx.MockTransport(handler)
    async with AsyncApiClient("http://ductor.test", api_key=API_KEY, transport=transport) as api:
        assert (await api.wait_for_result("run-1", timeout=5, interval=0)).succeeded
    assert len(asked) == 3


async def test_async_client_does_the_same(fake_server: Any) -> None:
    async with AsyncApiClient(fake_server.url, api_key=API_KEY) as api:
        run = await api.trigger("charge-order", {"id": 2})
        done = await api.wait_for_result(run.id, timeout=5, interval=0.01)
        assert done.output == {"echo": {"id": 2}}
        accepted = await api.send_event("order.paid")
        assert accepted.id == "evt-1"
        await api.signal(run.id, "go", [1, 2])
        await api.cancel(run.id)
        with pytest.raises(ApiError) as info:
            await api.cancel("missing")
        assert info.value.code == "run.not_found"
    assert fake_server.signals == [("run-1", "go", [1, 2])]


_DEEP = b"[" * 100_000 + b"]" * 100_000
_UNREADABLE_ANSWERS = {  # read as a run (200) and as an error (502)
    "invalid UTF-8": b'{"code":"\xff","id":"\xff"}',
    "nested too deep": b'{"details":' + _DEEP + b',"input":' + _DEEP + b"}",
}


@pytest.mark.parametrize("status", [200, 502])
@pytest.mark.parametrize("body", _UNREADABLE_ANSWERS.values(), ids=list(_UNREADABLE_ANSWERS))
def test_an_answer_that_is_not_json_text_is_an_api_error(body: bytes, status: int) -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(status, content=body))
    api = ApiClient("http://ductor.test", api_key=API_KEY, transport=transport)
    with api, pytest.raises(ApiError) as info:
        api.get_run("run-1")
    assert info.value.status == status
    assert info.value.code == ("api.bad_response" if status == 200 else "api.error")
