"""The inference proxy's resources under `/v1/ai`: the OpenAI-compatible
`chat/completions` and `embeddings`, the tenant's settings and price table, and
the record of every model call. Thin handlers over `AiService`.

A whole answer is the upstream's JSON as it sent it, with `Ductor-Request-Id` and
`Ductor-Cost-Micros`; a stream is `text/event-stream`, passed on event by event,
with `Ductor-Request-Id` (its cost is on its record once it ends).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Annotated, Any

from litestar import Controller, MediaType, Request, Response, delete, get, post, put
from litestar.di import NamedDependency, Provide
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath, FromQuery, HeaderParameter, JSONBody, QueryParameter
from litestar.response import Stream

from ductor_core.errors import DuctorError
from ductor_server.services.ai import (
    AiRequestPage,
    AiRequestView,
    AiService,
    AiSettingsBody,
    AiSettingsView,
    PriceBody,
    PriceView,
    ProxyAnswer,
)
from ductor_server.transports.rest.bodies import NO_BODY, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import (
    V1_ERRORS,
    ApiError,
    also_ok,
    error_response,
    status_for,
)
from ductor_server.transports.rest.idempotency import answered

_FORWARDED = (
    "Forwarded to the upstream as sent (any other OpenAI field too); "
    "`ductor_connection` is taken off first."
)
_CONNECTION_FIELD = {
    "type": "string",
    "description": "The tenant's `openai` connection (else the header's, else the default).",
}
ChatBody = Annotated[
    dict[str, Any] | NoBody,
    Body(
        media_type=RequestEncodingType.JSON,
        description="An OpenAI chat completion request. " + _FORWARDED,
        schema_extra={
            "required": ["model", "messages"],
            "properties": {
                "model": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object"}, "minItems": 1},
                "stream": {"type": "boolean"},
                "max_tokens": {"type": "integer"},
                "ductor_connection": _CONNECTION_FIELD,
            },
        },
    ),
]
EmbeddingsBody = Annotated[
    dict[str, Any] | NoBody,
    Body(
        media_type=RequestEncodingType.JSON,
        description="An OpenAI embeddings request. " + _FORWARDED,
        schema_extra={
            "required": ["model", "input"],
            "properties": {
                "model": {"type": "string"},
                "input": {},
                "ductor_connection": _CONNECTION_FIELD,
            },
        },
    ),
]
ConnectionHeader = Annotated[
    str | None,
    HeaderParameter(
        name="Ductor-Connection",
        description="The tenant's `openai` connection to forward to (else the body's "
        "`ductor_connection`, else the tenant's default).",
    ),
]


def provide_ai(request: Request[Any, Any, Any]) -> AiService:
    """The inference proxy's service."""
    return services_of(request).ai


def _body(data: dict[str, Any] | NoBody) -> dict[str, Any]:
    if data is NO_BODY:
        raise ApiError(
            "send a JSON object body",
            code="request.invalid",
            details={"problems": [{"pointer": "", "message": "the body is empty"}]},
        )
    assert isinstance(data, dict)
    return data


async def _proxied(call: Awaitable[ProxyAnswer]) -> Response[Any]:
    """The proxy's answer; a failure that kept a record says its id in the
    `Ductor-Request-Id` header too, as a success does."""
    try:
        answer = await call
    except DuctorError as exc:
        record = exc.details.get("request_id") if isinstance(exc.details, dict) else None
        if not isinstance(record, str):
            raise
        status = status_for(exc.code, retryable=exc.retryable)
        refused = error_response(exc.code, exc.message, exc.details, status=status)
        refused.headers["Ductor-Request-Id"] = record
        return refused
    return _respond(answer)


def _respond(answer: ProxyAnswer) -> Response[Any]:
    if answer.stream is not None:
        return Stream(
            answer.stream,
            media_type="text/event-stream",
            headers={**answer.headers, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return Response(
        content=answer.content or b"",
        media_type=MediaType.JSON,
        headers=answer.headers,
    )


class AiController(Controller):
    """The inference proxy and its records."""

    path = "/v1/ai"
    tags = ("ai",)
    dependencies = {"ai": Provide(provide_ai, sync_to_thread=False)}  # noqa: RUF012

    @post("/chat/completions", status_code=200, responses=V1_ERRORS)
    async def chat_completions(
        self,
        tenant_id: NamedDependency[str],
        ai: NamedDependency[AiService],
        connection: ConnectionHeader = None,
        data: ChatBody = NO_BODY,
    ) -> Response[Any]:
        """An OpenAI chat completion from the tenant's upstream (`stream: true` for
        server-sent events). 502 `ai.upstream_error`, 504 `ai.upstream_timeout`,
        429 `budget.exceeded` (nothing sent upstream)."""
        return await _proxied(ai.proxy(tenant_id, "chat", _body(data), connection=connection))

    @post("/embeddings", status_code=200, responses=V1_ERRORS)
    async def embeddings(
        self,
        tenant_id: NamedDependency[str],
        ai: NamedDependency[AiService],
        connection: ConnectionHeader = None,
        data: EmbeddingsBody = NO_BODY,
    ) -> Response[Any]:
        """OpenAI embeddings from the tenant's upstream."""
        return await _proxied(ai.proxy(tenant_id, "embeddings", _body(data), connection=connection))

    @get("/settings", responses=V1_ERRORS)
    async def get_settings(
        self, tenant_id: NamedDependency[str], ai: NamedDependency[AiService]
    ) -> AiSettingsView:
        """The tenant's default connection and upstream timeout."""
        return await ai.get_settings(tenant_id)

    @put("/settings", status_code=200, responses=V1_ERRORS)
    async def put_settings(
        self,
        tenant_id: NamedDependency[str],
        ai: NamedDependency[AiService],
        data: JSONBody[AiSettingsBody | NoBody] = NO_BODY,
    ) -> AiSettingsView:
        """Replace the tenant's default connection (an `openai` one) and timeout."""
        return await ai.put_settings(tenant_id, required(data))

    @get("/prices", responses=V1_ERRORS)
    async def list_prices(
        self, tenant_id: NamedDependency[str], ai: NamedDependency[AiService]
    ) -> list[PriceView]:
        """The tenant's price table, by model."""
        return await ai.list_prices(tenant_id)

    @put(
        "/prices/{model:path}",
        status_code=201,
        responses=also_ok(PriceView, "The model's earlier price was replaced"),
    )
    async def put_price(
        self,
        model: FromPath[str],
        tenant_id: NamedDependency[str],
        ai: NamedDependency[AiService],
        data: JSONBody[PriceBody | NoBody] = NO_BODY,
    ) -> Response[PriceView]:
        """Set the price of a model in micros per million tokens (201 created, 200
        replaced); the model `*` prices every model without a price of its own."""
        return answered(await ai.put_price(tenant_id, model.lstrip("/"), required(data)))

    @get("/prices/{model:path}", responses=V1_ERRORS)
    async def get_price(
        self, model: FromPath[str], tenant_id: NamedDependency[str], ai: NamedDependency[AiService]
    ) -> PriceView:
        """The price of one model."""
        return await ai.get_price(tenant_id, model.lstrip("/"))

    @delete("/prices/{model:path}", status_code=204, responses=V1_ERRORS)
    async def delete_price(
        self, model: FromPath[str], tenant_id: NamedDependency[str], ai: NamedDependency[AiService]
    ) -> None:
        """Remove the price of one model (its calls cost 0 from now on, unless `*` is set)."""
        await ai.delete_price(tenant_id, model.lstrip("/"))

    @get("/requests", responses=V1_ERRORS)
    async def list_requests(
        self,
        tenant_id: NamedDependency[str],
        ai: NamedDependency[AiService],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> AiRequestPage:
        """The tenant's model calls, newest first, a page at a time."""
        return await ai.list_requests(tenant_id, cursor=cursor, limit=limit)

    @get("/requests/{request_id:str}", responses=V1_ERRORS)
    async def get_request(
        self,
        request_id: FromPath[str],
        tenant_id: NamedDependency[str],
        ai: NamedDependency[AiService],
    ) -> AiRequestView:
        """One model call: model, tokens, latency, status and cost."""
        return await ai.get_request(tenant_id, request_id)


__all__ = ["AiController"]
