"""The `slack` provider against a local sink that answers like a Slack incoming
webhook (`ok`, or a 4xx/5xx with an error word); the secret URL never leaks."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ductor_server.providers import ProviderFailed, builtin_providers
from ductor_server.providers.slack import (
    PostMessageInput,
    SlackProvider,
    SlackSecrets,
    SlackSettings,
)

from .conftest import MakeContext
from .sink import HttpSink, Seen, reply

HOOK_PATH = "/services/T0AAA/B0BBB/xoxSecretHookToken123"


def secrets(sink: HttpSink) -> SlackSecrets:
    return msgspec.convert({"webhook_url": sink.url + HOOK_PATH}, SlackSecrets)


def message(**fields: Any) -> PostMessageInput:
    return msgspec.convert({"text": "Deploy done", **fields}, PostMessageInput)


def like_slack(seen: Seen) -> Any:
    """Slack's answers: `ok`, `no_text` for a message without text, and
    `invalid_payload` for one it cannot parse."""
    if seen.path != HOOK_PATH:
        return reply(404, "no_service")
    body = seen.json()
    if not isinstance(body.get("blocks", []), list):
        return reply(400, "invalid_payload")
    if "text" not in body:
        return reply(400, "no_text")
    return reply(200, "ok")


async def fail(coro: Any) -> ProviderFailed:
    with pytest.raises(ProviderFailed) as info:
        await coro
    return info.value


async def test_post_message(sink: HttpSink, make_context: MakeContext) -> None:
    assert isinstance(builtin_providers().get("slack"), SlackProvider)
    sink.script(like_slack)
    blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "*Deploy* done"}}]
    out = await SlackProvider().call(
        "post_message",
        SlackSettings(),
        secrets(sink),
        message(blocks=blocks, username="ductor", icon_emoji=":robot_face:"),
        make_context(),
    )
    assert out == {"ok": True}
    assert sink.last.method == "POST"
    assert sink.last.path == HOOK_PATH
    assert sink.last.json() == {
        "text": "Deploy done",
        "blocks": blocks,
        "username": "ductor",
        "icon_emoji": ":robot_face:",
    }


@pytest.mark.parametrize(
    ("status", "word", "code", "retryable"),
    [
        (400, "invalid_payload", "slack.invalid_payload", False),
        (403, "action_prohibited", "slack.action_prohibited", False),
        (404, "channel_not_found", "slack.channel_not_found", False),
        (410, "channel_is_archived", "slack.channel_is_archived", False),
        (429, "rate_limited", "slack.rate_limited", True),
        (500, "rollup_error", "slack.rollup_error", True),
        (502, "<html>Bad Gateway</html>", "slack.502", True),
    ],
)
async def test_slack_errors(
    sink: HttpSink,
    make_context: MakeContext,
    status: int,
    word: str,
    code: str,
    retryable: bool,
) -> None:
    sink.answer(status, word)
    failed = await fail(
        SlackProvider().call(
            "post_message", SlackSettings(), secrets(sink), message(), make_context()
        )
    )
    assert failed.error.code == code
    assert failed.error.retryable is retryable
    assert failed.error.details == {"status": status}


async def test_the_url_never_appears(sink: HttpSink, make_context: MakeContext) -> None:
    provider = SlackProvider()
    token = "xoxSecretHookToken123"
    failures = []
    sink.answer(500, f"error at {sink.url + HOOK_PATH}")
    failures.append(
        await fail(
            provider.call("post_message", SlackSettings(), secrets(sink), message(), make_context())
        )
    )
    failures.append(
        await fail(
            provider.call(
                "post_message", SlackSettings(), secrets(sink), message(), make_context(allow=[])
            )
        )
    )
    sink.delay = 2.0
    failures.append(
        await fail(
            provider.call(
                "post_message", SlackSettings(), secrets(sink), message(), make_context(timeout=0.3)
            )
        )
    )
    codes = [f.error.code for f in failures]
    assert codes == ["slack.500", "outbound.forbidden", "slack.timeout"]
    for failed in failures:
        assert token not in str(failed) + repr(failed.error)
    with HttpSink() as gone:
        url = gone.url
    down = msgspec.convert({"webhook_url": url + HOOK_PATH}, SlackSecrets)
    failed = await fail(
        provider.call("post_message", SlackSettings(), down, message(), make_context())
    )
    assert (failed.error.code, failed.error.retryable) == ("slack.connection", True)
    assert token not in str(failed) + repr(failed.error)


def test_validation() -> None:
    for bad in ({"webhook_url": "hooks.slack.com/x"}, {"webhook_url": "ftp://x"}, {}):
        with pytest.raises(msgspec.ValidationError) as info:
            msgspec.convert(bad, SlackSecrets)
        assert "hooks.slack.com/x" not in str(info.value)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"channel": "#x"}, SlackSettings)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({}, PostMessageInput)


async def test_check_posts_nothing(sink: HttpSink, make_context: MakeContext) -> None:
    sink.script(like_slack)
    provider = SlackProvider()
    live = await provider.test(SlackSettings(), secrets(sink), make_context())
    assert live.ok is True
    assert live.details == {"status": 400, "code": "slack.no_text"}
    assert sink.last.json() == {}
    revoked = msgspec.convert({"webhook_url": sink.url + "/services/gone"}, SlackSecrets)
    dead = await provider.test(SlackSettings(), revoked, make_context())
    assert dead.ok is False
    assert dead.details == {"status": 404, "code": "slack.no_service"}
