"""The `http` provider against a real HTTP server on 127.0.0.1: the request it
sends, the answers it maps, the origin it keeps to, and the secrets it keeps out
of every error and output."""

from __future__ import annotations

import base64

import msgspec
import pytest

from ductor_server.providers import ProviderFailed, builtin_providers
from ductor_server.providers._exchange import Redactor, exchange
from ductor_server.providers.http import (
    HttpProvider,
    HttpSecrets,
    HttpSettings,
    RequestInput,
)

from .conftest import KEY, MakeContext
from .sink import HttpSink, Seen, reply

TOKEN = "sk_live_51HtopSecretValue"


def settings(sink: HttpSink, **extra: object) -> HttpSettings:
    return msgspec.convert({"base_url": f"{sink.url}/api/v1", **extra}, HttpSettings)


def secrets(**extra: object) -> HttpSecrets:
    return msgspec.convert(extra or {"bearer_token": TOKEN}, HttpSecrets)


def request(**fields: object) -> RequestInput:
    return msgspec.convert(fields, RequestInput)


async def fail(coro: object) -> ProviderFailed:
    with pytest.raises(ProviderFailed) as info:
        await coro  # type: ignore[misc]
    return info.value


def test_registered_as_builtin() -> None:
    registry = builtin_providers()
    provider = registry.get("http")
    assert isinstance(provider, HttpProvider)
    assert registry.origin("http") == "builtin"
    assert provider.operations["request"].required_inputs() == frozenset()


async def test_request_sends_path_query_headers_body_and_key(
    sink: HttpSink, make_context: MakeContext
) -> None:
    sink.answer(201, {"id": 7}, ETag='"v1"', Set_Cookie="session=1")
    out = await HttpProvider().call(
        "request",
        settings(sink, headers={"Accept": "application/json"}),
        secrets(),
        request(
            method="PUT",
            path="/users/42",
            query={"q": "a b", "n": 3, "flag": True, "tag": ["x", "y"]},
            headers={"X-Trace": "t1"},
            body={"name": "Ada"},
        ),
        make_context(),
    )
    assert out == {
        "status": 201,
        "headers": {"content-type": "application/json", "content-length": "9", "etag": '"v1"'},
        "body": {"id": 7},
    }
    seen = sink.last
    assert seen.method == "PUT"
    assert seen.path == "/api/v1/users/42?q=a+b&n=3&flag=true&tag=x&tag=y"
    assert seen.headers["idempotency-key"] == KEY
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["accept"] == "application/json"
    assert seen.headers["x-trace"] == "t1"
    assert seen.headers["content-type"] == "application/json"
    assert seen.json() == {"name": "Ada"}


async def test_method_defaults_to_get_or_post_with_body(
    sink: HttpSink, make_context: MakeContext
) -> None:
    provider = HttpProvider()
    await provider.call("request", settings(sink), secrets(), request(), make_context())
    assert (sink.last.method, sink.last.path) == ("GET", "/api/v1")
    await provider.call("request", settings(sink), secrets(), request(body=[1]), make_context())
    assert (sink.last.method, sink.last.body) == ("POST", b"[1]")


async def test_basic_auth_and_secret_headers(sink: HttpSink, make_context: MakeContext) -> None:
    provider = HttpProvider()
    await provider.call(
        "request",
        settings(sink),
        secrets(username="ada", password="pw-secret", headers={"X-Api-Key": "k-secret"}),
        request(headers={"x-api-key": "from-input", "AUTHORIZATION": "Bearer forged"}),
        make_context(),
    )
    assert (
        sink.last.headers["authorization"] == "Basic " + base64.b64encode(b"ada:pw-secret").decode()
    )
    # The secret headers win, whatever the letter case, and are sent once.
    assert sink.last.headers["x-api-key"] == "k-secret"
    raw = [name.lower() for name in sink.last.raw_header_names]
    assert raw.count("x-api-key") == raw.count("authorization") == 1


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (500, True),
        (503, True),
        (408, True),
        (425, True),
        (429, True),
        (400, False),
        (404, False),
        (422, False),
    ],
)
async def test_status_mapping(
    sink: HttpSink, make_context: MakeContext, status: int, retryable: bool
) -> None:
    sink.answer(status, {"error": "nope"}, Retry_After="3")
    failed = await fail(
        HttpProvider().call("request", settings(sink), secrets(), request(path="x"), make_context())
    )
    assert failed.error.code == f"http.{status}"
    assert failed.error.retryable is retryable
    assert failed.error.retry_after_seconds == 3.0
    assert failed.error.details["body"] == {"error": "nope"}
    assert failed.error.details["status"] == status


async def test_redirect_is_an_answer_not_followed(
    sink: HttpSink, make_context: MakeContext
) -> None:
    sink.answer(302, b"", Location="http://127.0.0.1:1/elsewhere")
    failed = await fail(
        HttpProvider().call(
            "request", settings(sink), secrets(), request(path="go"), make_context()
        )
    )
    assert failed.error.code == "http.302"
    assert failed.error.retryable is False
    assert failed.error.details["headers"]["location"] == "http://127.0.0.1:1/elsewhere"
    assert len(sink.seen) == 1


@pytest.mark.parametrize(
    "path",
    [
        "http://127.0.0.1:1/x",
        "https://evil.example/x",
        "//evil.example/x",
        "javascript:alert(1)",
        "mailto:a@b.c",
        "\\\\evil.example\\x",
        "../admin",
        "a/%2e%2E/admin",
        "a/..%2Fadmin",  # a `..` segment once the encoded slash is decoded
        "a%2F%2E%2E%2Fadmin",
        "..%5Cadmin",  # an encoded backslash
        "a/%5C%5Cevil.example",
        "./x",
        "a\r\nHost: evil",
        "/" + "a" * 70_000,  # longer than a URL may be: refused, not a crash
    ],
)
async def test_path_may_not_leave_the_origin(
    sink: HttpSink, make_context: MakeContext, path: str
) -> None:
    failed = await fail(
        HttpProvider().call(
            "request", settings(sink), secrets(), request(path=path), make_context()
        )
    )
    assert failed.error.code == "http.bad_input"
    assert failed.error.retryable is False
    assert failed.error.details["problems"][0]["pointer"] == "/path"
    assert sink.seen == []


async def test_a_query_too_long_for_a_url_is_bad_input(
    sink: HttpSink, make_context: MakeContext
) -> None:
    failed = await fail(
        HttpProvider().call(
            "request",
            settings(sink),
            secrets(),
            request(query={"q": "x" * 70_000}),
            make_context(),
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("http.bad_input", False)
    assert failed.error.details["problems"][0]["pointer"] == "/query"
    assert sink.seen == []


async def test_bad_headers_refused_with_pointers(sink: HttpSink, make_context: MakeContext) -> None:
    failed = await fail(
        HttpProvider().call(
            "request",
            settings(sink),
            secrets(),
            request(
                headers={
                    "X-Ok": "a\r\nInjected: 1",
                    "Bad Name": "v",
                    "Host": "x",
                    "X-Line\n": "v",  # a name is a token whole, a trailing line break too
                }
            ),
            make_context(),
        )
    )
    assert failed.error.code == "http.bad_input"
    pointers = {p["pointer"] for p in failed.error.details["problems"]}
    assert pointers == {"/headers/X-Ok", "/headers/Bad Name", "/headers/Host", "/headers/X-Line\n"}
    assert sink.seen == []


async def test_a_header_value_that_is_not_ascii_is_bad_input_not_a_crash(
    sink: HttpSink, make_context: MakeContext
) -> None:
    failed = await fail(
        HttpProvider().call(
            "request",
            settings(sink),
            secrets(),
            request(headers={"X-Team": "café", "X-Bell": "a\x07b", "X-Tab": "a\tb"}),
            make_context(),
        )
    )
    assert failed.error.code == "http.bad_input"
    assert not failed.error.retryable
    pointers = [p["pointer"] for p in failed.error.details["problems"]]
    assert pointers == ["/headers/X-Team", "/headers/X-Bell"]
    assert sink.seen == []


async def test_loopback_refused_without_allow(sink: HttpSink, make_context: MakeContext) -> None:
    failed = await fail(
        HttpProvider().call("request", settings(sink), secrets(), request(), make_context(allow=[]))
    )
    assert failed.error.code == "outbound.forbidden"
    assert failed.error.retryable is False
    assert failed.error.details == {"host": "127.0.0.1"}
    assert "127.0.0.1" in failed.error.message
    assert sink.seen == []


async def test_huge_response_is_capped(sink: HttpSink, make_context: MakeContext) -> None:
    sink.answer(200, b"x" * (11 * 1024 * 1024))
    failed = await fail(
        HttpProvider().call("request", settings(sink), secrets(), request(), make_context())
    )
    assert failed.error.code == "http.response_too_large"
    assert failed.error.retryable is False


async def test_timeout_is_retryable(sink: HttpSink, make_context: MakeContext) -> None:
    sink.delay = 2.0
    failed = await fail(
        HttpProvider().call(
            "request", settings(sink, timeout=0.3), secrets(), request(), make_context()
        )
    )
    assert failed.error.code == "http.timeout"
    assert failed.error.retryable is True


async def test_step_timeout_bounds_the_call(sink: HttpSink, make_context: MakeContext) -> None:
    sink.delay = 2.0
    failed = await fail(
        HttpProvider().call(
            "request", settings(sink), secrets(), request(), make_context(timeout=0.3)
        )
    )
    assert failed.error.code == "http.timeout"


async def test_connection_refused_is_retryable(make_context: MakeContext) -> None:
    with HttpSink() as gone:
        url = gone.url
    failed = await fail(
        HttpProvider().call(
            "request",
            msgspec.convert({"base_url": url}, HttpSettings),
            secrets(),
            request(),
            make_context(),
        )
    )
    assert failed.error.code == "http.connection"
    assert failed.error.retryable is True


async def test_secret_never_in_errors_or_outputs(sink: HttpSink, make_context: MakeContext) -> None:
    """An upstream that echoes the request headers back, in its body and in its
    error answers: the output and every failure carry `***` instead."""

    def echo(seen: Seen) -> object:
        status = 200 if seen.path.endswith("/ok") else 503
        return reply(status, {"got": seen.headers, "note": f"token was {TOKEN}"})

    sink.script(echo)  # type: ignore[arg-type]
    provider = HttpProvider()
    for creds in (
        {"bearer_token": TOKEN},
        {"headers": {"X-Api-Key": TOKEN}},
        {"username": "ada", "password": TOKEN},
    ):
        out = await provider.call(
            "request", settings(sink), secrets(**creds), request(path="ok"), make_context()
        )
        failed = await fail(
            provider.call(
                "request", settings(sink), secrets(**creds), request(path="no"), make_context()
            )
        )
        for text in (repr(out), str(failed), repr(failed.error)):
            assert TOKEN not in text
            assert base64.b64encode(f"ada:{TOKEN}".encode()).decode() not in text
        assert "***" in repr(out)


def test_settings_and_secrets_validation() -> None:
    for bad in (
        {"base_url": "ftp://example.com"},
        {"base_url": "/relative"},
        {"base_url": "https://user:pw@example.com"},
        {"base_url": "https://example.com?x=1"},
        {"base_url": "https://example.com", "timeout": 0},
        {"base_url": "https://example.com", "headers": {"X": "a\nb"}},
        {"base_url": "https://example.com", "extra": 1},
    ):
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(bad, HttpSettings)
    for bad_secret in (
        {"bearer_token": "a", "username": "u", "password": "p"},
        {"bearer_token": "a", "headers": {"Authorization": "x"}},
        {"username": "u"},
        {"bearer_token": "a\nb"},
    ):
        with pytest.raises(msgspec.ValidationError) as info:
            msgspec.convert(bad_secret, HttpSecrets)
        assert "a\nb" not in str(info.value)


async def test_check_reachable_refused_and_down(sink: HttpSink, make_context: MakeContext) -> None:
    provider = HttpProvider()
    sink.answer(404)
    result = await provider.test(settings(sink), secrets(), make_context())
    assert result.ok is True
    assert sink.last.method == "HEAD"
    assert sink.last.headers["authorization"] == f"Bearer {TOKEN}"
    sink.answer(401)
    result = await provider.test(settings(sink), secrets(), make_context())
    assert result.ok is False
    assert result.details == {"status": 401}
    result = await provider.test(settings(sink), secrets(), make_context(allow=[]))
    assert result.ok is False
    assert result.details == {"code": "outbound.forbidden", "host": "127.0.0.1"}


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
async def test_a_port_out_of_range_is_bad_input_not_a_crash(
    port: str, make_context: MakeContext
) -> None:
    with pytest.raises(msgspec.ValidationError, match="port from 1 to 65535"):
        msgspec.convert({"base_url": f"http://127.0.0.1:{port}/"}, HttpSettings)
    failed = await fail(
        exchange(
            make_context(),
            provider="http",
            method="GET",
            url=f"http://127.0.0.1:{port}/",
            what="GET the API",
            redactor=Redactor([]),
        )
    )
    assert (failed.error.code, failed.error.retryable) == ("http.bad_input", False)


async def test_a_short_secret_is_hidden_only_where_it_stands_alone(
    sink: HttpSink, make_context: MakeContext
) -> None:
    # An API echoing what it got; the secret header's value is one letter.
    sink.answer(200, {"key": "e", "said": "e, twice: e", "note": "see the readme", TOKEN: TOKEN})
    out = await HttpProvider().call(
        "request",
        settings(sink),
        secrets(headers={"X-K": "e"}, bearer_token=TOKEN),
        request(),
        make_context(),
    )
    assert sink.last.headers["x-k"] == "e"
    assert out == {
        "status": 200,
        "headers": {"content-type": "application/json", "content-length": "119"},
        "body": {"key": "***", "said": "***, twice: ***", "note": "see the readme", "***": "***"},
    }


async def test_json_nested_too_deeply_is_kept_as_text(
    sink: HttpSink, make_context: MakeContext
) -> None:
    """An answer that says JSON but nests deeper than a request body may (64 levels)
    is the body as text, as one that does not parse: not a crash that is retried."""
    provider = HttpProvider()
    for depth in (65, 600, 5000):
        deep = "[" * depth + "]" * depth
        sink.answer(200, deep.encode(), Content_Type="application/json")
        out = await provider.call("request", settings(sink), secrets(), request(), make_context())
        assert out["body"] == deep
    sink.answer(200, ("[" * 64 + "]" * 64).encode(), Content_Type="application/json")
    out = await provider.call("request", settings(sink), secrets(), request(), make_context())
    assert isinstance(out["body"], list)
