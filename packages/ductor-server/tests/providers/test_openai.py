"""The `openai` provider against a scripted upstream on 127.0.0.1 that answers like
the OpenAI API: the request it sends, the output it makes, the errors it maps."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ductor_server.providers import ProviderFailed, builtin_providers
from ductor_server.providers.openai import (
    DEFAULT_BASE_URL,
    ChatInput,
    OpenAIProvider,
    OpenAISecrets,
    OpenAISettings,
)

from .conftest import KEY, MakeContext
from .sink import HttpSink, Seen, reply

API_KEY = "sk-proj-TopSecretKey0123456789"

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris."},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
}


def settings(sink: HttpSink, **extra: Any) -> OpenAISettings:
    return msgspec.convert({"base_url": sink.url + "/v1", **extra}, OpenAISettings)


def secrets() -> OpenAISecrets:
    return OpenAISecrets(api_key=API_KEY)


def chat(**fields: Any) -> ChatInput:
    base = {"messages": [{"role": "user", "content": "Capital of France?"}]}
    return msgspec.convert({**base, **fields}, ChatInput)


def upstream_error(status: int, message: str, type_: str, code: str | None = None) -> Any:
    return reply(status, {"error": {"message": message, "type": type_, "code": code}})


async def fail(coro: Any) -> ProviderFailed:
    with pytest.raises(ProviderFailed) as info:
        await coro
    return info.value


async def test_chat(sink: HttpSink, make_context: MakeContext) -> None:
    assert isinstance(builtin_providers().get("openai"), OpenAIProvider)
    sink.answer(200, COMPLETION)
    out = await OpenAIProvider().call(
        "chat",
        settings(sink, organization="org-1"),
        secrets(),
        chat(
            model="gpt-4o-mini",
            temperature=0.2,
            max_tokens=20,
            response_format={"type": "text"},
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Capital of France?"},
            ],
        ),
        make_context(),
    )
    assert out == {
        "id": "chatcmpl-1",
        "model": "gpt-4o-mini-2024-07-18",
        "content": "Paris.",
        "finish_reason": "stop",
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    }
    seen = sink.last
    assert (seen.method, seen.path) == ("POST", "/v1/chat/completions")
    assert seen.headers["authorization"] == f"Bearer {API_KEY}"
    assert seen.headers["openai-organization"] == "org-1"
    assert seen.headers["idempotency-key"] == KEY
    assert seen.json() == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Capital of France?"},
        ],
        "temperature": 0.2,
        "max_tokens": 20,
        "response_format": {"type": "text"},
    }


async def test_default_model(sink: HttpSink, make_context: MakeContext) -> None:
    sink.answer(200, COMPLETION)
    provider = OpenAIProvider()
    await provider.call(
        "chat", settings(sink, default_model="gpt-4o"), secrets(), chat(), make_context()
    )
    assert sink.last.json()["model"] == "gpt-4o"
    failed = await fail(provider.call("chat", settings(sink), secrets(), chat(), make_context()))
    assert (failed.error.code, failed.error.retryable) == ("openai.bad_input", False)
    assert failed.error.details["problems"][0]["pointer"] == "/model"
    assert len(sink.seen) == 1


@pytest.mark.parametrize(
    ("answer", "code", "retryable"),
    [
        (
            upstream_error(429, "Rate limit reached", "requests", "rate_limit_exceeded"),
            "openai.rate_limited",
            True,
        ),
        (
            upstream_error(
                429, "You exceeded your quota", "insufficient_quota", "insufficient_quota"
            ),
            "openai.quota_exceeded",
            False,
        ),
        (
            upstream_error(
                401,
                "Incorrect API key provided: sk-proj-Top***",
                "invalid_request_error",
                "invalid_api_key",
            ),
            "openai.unauthorized",
            False,
        ),
        (
            upstream_error(400, "Invalid value for 'temperature'", "invalid_request_error"),
            "openai.bad_request",
            False,
        ),
        (
            upstream_error(
                404, "The model 'x' does not exist", "invalid_request_error", "model_not_found"
            ),
            "openai.not_found",
            False,
        ),
        (
            upstream_error(500, "The server had an error", "server_error"),
            "openai.server_error",
            True,
        ),
        (reply(503, "upstream unavailable"), "openai.server_error", True),
    ],
)
async def test_upstream_errors(
    sink: HttpSink, make_context: MakeContext, answer: Any, code: str, retryable: bool
) -> None:
    sink.script(lambda _: answer)
    failed = await fail(
        OpenAIProvider().call(
            "chat", settings(sink, default_model="m"), secrets(), chat(), make_context()
        )
    )
    assert failed.error.code == code
    assert failed.error.retryable is retryable
    assert failed.error.details["status"] == answer.status


async def test_rate_limit_carries_retry_after(sink: HttpSink, make_context: MakeContext) -> None:
    sink.answer(429, {"error": {"message": "slow down", "type": "requests"}}, Retry_After="7")
    failed = await fail(
        OpenAIProvider().call(
            "chat", settings(sink, default_model="m"), secrets(), chat(), make_context()
        )
    )
    assert failed.error.retry_after_seconds == 7.0
    assert "slow down" in failed.error.message


async def test_bad_response(sink: HttpSink, make_context: MakeContext) -> None:
    sink.answer(200, {"object": "list", "data": []})
    failed = await fail(
        OpenAIProvider().call(
            "chat", settings(sink, default_model="m"), secrets(), chat(), make_context()
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("openai.bad_response", False)
    assert failed.error.details == {"status": 200}
    sink.answer(201, {**COMPLETION, "choices": []})
    failed = await fail(
        OpenAIProvider().call(
            "chat", settings(sink, default_model="m"), secrets(), chat(), make_context()
        )
    )
    assert (failed.error.code, failed.error.details) == ("openai.bad_response", {"status": 201})
    # A completion nested deeper than a decoder can follow is a bad answer, not a crash.
    deep = b'{"choices": [{"message": {"content": "x", "x": ' + b"[" * 100_000
    sink.script(
        lambda _: reply(200, deep + b"]" * 100_000 + b"}}]}", Content_Type="application/json")
    )
    failed = await fail(
        OpenAIProvider().call(
            "chat", settings(sink, default_model="m"), secrets(), chat(), make_context()
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("openai.bad_response", False)


async def test_key_never_in_errors_or_outputs(sink: HttpSink, make_context: MakeContext) -> None:
    def echo(seen: Seen) -> Any:
        said = seen.headers["authorization"]
        if seen.json()["model"] == "bad":
            return upstream_error(
                401, f"Incorrect API key provided: {said}", "invalid_request_error"
            )
        return reply(
            200,
            {**COMPLETION, "choices": [{"message": {"content": said}, "finish_reason": "stop"}]},
        )

    sink.script(echo)
    provider = OpenAIProvider()
    out = await provider.call(
        "chat", settings(sink, default_model="m"), secrets(), chat(), make_context()
    )
    assert out["content"] == "Bearer ***"
    failed = await fail(
        provider.call(
            "chat", settings(sink, default_model="bad"), secrets(), chat(), make_context()
        )
    )
    assert failed.error.code == "openai.unauthorized"
    assert API_KEY not in str(failed) + repr(failed.error)
    assert "***" in failed.error.message


async def test_guard_timeout_and_outage(sink: HttpSink, make_context: MakeContext) -> None:
    provider = OpenAIProvider()
    s = settings(sink, default_model="m")
    failed = await fail(provider.call("chat", s, secrets(), chat(), make_context(allow=[])))
    assert failed.error.code == "outbound.forbidden"
    assert sink.seen == []
    sink.delay = 2.0
    failed = await fail(provider.call("chat", s, secrets(), chat(), make_context(timeout=0.3)))
    assert (failed.error.code, failed.error.retryable) == ("openai.timeout", True)
    with HttpSink() as gone:
        url = gone.url
    down = msgspec.convert({"base_url": url, "default_model": "m"}, OpenAISettings)
    failed = await fail(provider.call("chat", down, secrets(), chat(), make_context()))
    assert (failed.error.code, failed.error.retryable) == ("openai.connection", True)


def test_validation() -> None:
    assert (
        msgspec.convert({}, OpenAISettings).base_url
        == DEFAULT_BASE_URL
        == "https://api.openai.com/v1"
    )
    for bad in ({"base_url": "api.openai.com"}, {"organization": "a\r\nb"}, {"model": "x"}):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, OpenAISettings)
    for bad_input in (
        {"messages": []},
        {"messages": [{"role": "wizard", "content": "x"}]},
        {"messages": [{"role": "user", "content": "x"}], "temperature": 3},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad_input, ChatInput)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"api_key": ""}, OpenAISecrets)


async def test_check_lists_models(sink: HttpSink, make_context: MakeContext) -> None:
    provider = OpenAIProvider()
    sink.answer(200, {"object": "list", "data": [{"id": "gpt-4o"}]})
    ok = await provider.test(settings(sink), secrets(), make_context())
    assert ok.ok is True
    assert (sink.last.method, sink.last.path) == ("GET", "/v1/models")
    assert sink.last.headers["authorization"] == f"Bearer {API_KEY}"
    sink.answer(401, {"error": {"message": "Incorrect API key", "type": "invalid_request_error"}})
    refused = await provider.test(settings(sink), secrets(), make_context())
    assert (refused.ok, refused.details) == (
        False,
        {"code": "openai.unauthorized", "status": 401, "type": "invalid_request_error"},
    )
