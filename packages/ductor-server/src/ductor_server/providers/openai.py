"""The `openai` provider: chat completions from the OpenAI API, or any server that
speaks its `/chat/completions` and `/models` endpoints at another base URL.

It goes through the guarded HTTP client like every provider, sends the API key
as a bearer token, and maps the upstream's errors to stable codes (rate limits
and server errors retryable, refused keys and bad requests not). It must never
put the API key in an error or an output.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from ductor_core.runs import ErrorInfo
from ductor_server.engine.outbound import is_retryable_status
from ductor_server.providers._exchange import (
    Answer,
    Redactor,
    bad_input,
    check_url,
    elapsed_ms,
    exchange,
    failed_test,
    header_value_problem,
    unknown_operation,
)
from ductor_server.providers.base import (
    CallContext,
    CheckResult,
    Operation,
    ProviderFailed,
    provider_failure,
)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
Role = Literal["system", "developer", "user", "assistant"]

# The codes of upstream statuses; other statuses are `openai.<status>`.
_STATUS_CODES = {
    400: "openai.bad_request",
    401: "openai.unauthorized",
    403: "openai.forbidden",
    404: "openai.not_found",
    429: "openai.rate_limited",
}


class OpenAISettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `config`.

    Attributes:
        base_url: the API's base URL (`https://api.openai.com/v1`).
        organization: sent as `OpenAI-Organization`.
        default_model: the model a `chat` without one uses.
    """

    base_url: str = DEFAULT_BASE_URL
    organization: str | None = None
    default_model: str | None = None

    def __post_init__(self) -> None:
        check_url(self.base_url, query=False)
        if self.organization is not None and any(c in self.organization for c in "\r\n\0"):
            raise ValueError("organization may not contain CR, LF or NUL")
        if self.organization is not None and header_value_problem(self.organization):
            raise ValueError(
                "organization may hold only printable ASCII characters (it goes out in a header)"
            )


class OpenAISecrets(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A connection's `secrets`.

    Attributes:
        api_key: the API key, sent as `Authorization: Bearer <api_key>`.
    """

    api_key: Annotated[str, msgspec.Meta(min_length=1)]

    def __post_init__(self) -> None:
        if any(c in self.api_key for c in "\r\n\0 "):
            raise ValueError("api_key may not contain spaces, CR, LF or NUL")
        if header_value_problem(self.api_key):
            raise ValueError(
                "api_key may hold only printable ASCII characters (it goes out in a header)"
            )


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message of the conversation.

    Attributes:
        role: `system`, `developer`, `user` or `assistant`.
        content: the text (or a list of content parts).
        name: a participant's name.
    """

    role: Role
    content: str | list[dict[str, Any]]
    name: str | None = None


class ChatInput(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The input of `chat`.

    Attributes:
        messages: the conversation so far (at least one message).
        model: the model (the connection's `default_model` when absent).
        temperature: sampling temperature, 0 to 2.
        max_tokens: the most tokens the answer may take.
        response_format: e.g. `{"type": "json_object"}`.
    """

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    model: str | None = None
    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    max_tokens: Annotated[int, msgspec.Meta(ge=1)] | None = None
    response_format: dict[str, Any] | None = None


class Usage(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens the call used."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatOutput(msgspec.Struct, frozen=True, kw_only=True):
    """The output of `chat`.

    Attributes:
        id: the completion's id.
        model: the model that answered.
        content: the first choice's text (null when it answered with no text).
        finish_reason: why it stopped (`stop`, `length`, ...).
        usage: tokens used.
    """

    id: str
    model: str
    content: str | None
    finish_reason: str | None
    usage: Usage


class _Choice(msgspec.Struct, kw_only=True):
    message: dict[str, Any] = {}
    finish_reason: str | None = None


class _Completion(msgspec.Struct, kw_only=True):
    id: str = ""
    model: str = ""
    choices: list[_Choice]
    usage: Usage = Usage()


class OpenAIProvider:
    """The `openai` provider (one instance serves every connection)."""

    name: str = "openai"
    description: str = "Chat completions from the OpenAI API (or a compatible server)."
    settings: type[msgspec.Struct] = OpenAISettings
    secrets: type[msgspec.Struct] = OpenAISecrets
    operations: Mapping[str, Operation] = {
        "chat": Operation(
            name="chat",
            description="One chat completion: the model's answer to the messages.",
            input=ChatInput,
            output=ChatOutput,
        )
    }

    async def call(
        self,
        operation: str,
        settings: OpenAISettings,
        secrets: OpenAISecrets,
        input: ChatInput,
        context: CallContext,
    ) -> Any:
        """Run `chat`: POST `{base_url}/chat/completions`."""
        if operation != "chat":
            raise unknown_operation(self.name, operation)
        model = input.model or settings.default_model
        if not model:
            raise bad_input(
                "openai",
                [{"pointer": "/model", "message": "no model, and the connection has no default"}],
            )
        request: dict[str, Any] = {
            "model": model,
            "messages": [
                {k: v for k, v in msgspec.to_builtins(m).items() if v is not None}
                for m in input.messages
            ],
        }
        for field in ("temperature", "max_tokens", "response_format"):
            value = getattr(input, field)
            if value is not None:
                request[field] = value
        redactor = Redactor([secrets.api_key])
        headers = _headers(settings, secrets)
        headers["Content-Type"] = "application/json"
        headers["Idempotency-Key"] = context.idempotency_key
        url = _endpoint(settings, "chat/completions")
        answer = await exchange(
            context,
            provider="openai",
            method="POST",
            url=url,
            what=f"POST {url}",
            redactor=redactor,
            headers=headers,
            content=msgspec.json.encode(request),
        )
        if not answer.ok:
            raise _failure(answer, f"POST {url}")
        try:
            completion = msgspec.json.decode(answer.content, type=_Completion)
        except (msgspec.DecodeError, RecursionError) as exc:  # nested past the decoder's depth
            raise provider_failure(
                "openai.bad_response",
                f"POST {url} answered something other than a chat completion: {exc}",
                retryable=False,
                details={"status": answer.status},
            ) from None
        if not completion.choices:
            raise provider_failure(
                "openai.bad_response",
                f"POST {url} answered no choices",
                retryable=False,
                details={"status": answer.status},
            )
        choice = completion.choices[0]
        content = choice.message.get("content")
        output = ChatOutput(
            id=completion.id,
            model=completion.model or model,
            content=content if isinstance(content, str) else None,
            finish_reason=choice.finish_reason,
            usage=completion.usage,
        )
        return redactor.value(msgspec.to_builtins(output))

    async def test(
        self, settings: OpenAISettings, secrets: OpenAISecrets, context: CallContext
    ) -> CheckResult:
        """GET `{base_url}/models`: ok when it answers 2xx (the key works)."""
        url = _endpoint(settings, "models")
        started = time.perf_counter()
        try:
            answer = await exchange(
                context,
                provider="openai",
                method="GET",
                url=url,
                what=f"GET {url}",
                redactor=Redactor([secrets.api_key]),
                headers=_headers(settings, secrets),
            )
            if not answer.ok:
                raise _failure(answer, f"GET {url}")
        except ProviderFailed as exc:
            return failed_test(exc, started)
        return CheckResult(
            ok=True,
            message=f"GET {url} answered {answer.status}",
            latency_ms=elapsed_ms(started),
            details={"status": answer.status},
        )


def _endpoint(settings: OpenAISettings, path: str) -> str:
    return f"{settings.base_url.rstrip('/')}/{path}"


def _headers(settings: OpenAISettings, secrets: OpenAISecrets) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secrets.api_key}"}
    if settings.organization is not None:
        headers["OpenAI-Organization"] = settings.organization
    return headers


def _failure(answer: Answer, what: str) -> ProviderFailed:
    """An upstream error answer as a `ProviderFailed` (its message, type and code kept)."""
    error = answer.body.get("error") if isinstance(answer.body, dict) else None
    error = error if isinstance(error, dict) else {}
    upstream_code = error.get("code") if isinstance(error.get("code"), str) else None
    code = _STATUS_CODES.get(answer.status, f"openai.{answer.status}")
    retryable = is_retryable_status(answer.status)
    if answer.status >= 500:
        code = "openai.server_error"
    if answer.status == 429 and upstream_code == "insufficient_quota":
        code, retryable = "openai.quota_exceeded", False
    message = f"{what} answered {answer.status}"
    if isinstance(error.get("message"), str):
        message += f": {error['message'][:500]}"
    return ProviderFailed(
        ErrorInfo(
            code=code,
            message=message,
            retryable=retryable,
            retry_after_seconds=answer.retry_after_seconds,
            details={"status": answer.status, "type": error.get("type"), "code": upstream_code},
        )
    )


__all__ = [
    "DEFAULT_BASE_URL",
    "ChatInput",
    "ChatMessage",
    "ChatOutput",
    "OpenAIProvider",
    "OpenAISecrets",
    "OpenAISettings",
    "Usage",
]
