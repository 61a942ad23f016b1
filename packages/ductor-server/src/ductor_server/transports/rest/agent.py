"""The chat agent's resources under `/v1/agent`: conversations and their messages.
Thin handlers over `AgentService`; a POST answers the turn it ran (201), or its
error with the conversation and turn in `details`."""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, JSONBody, QueryParameter

from ductor_server.services.agent import (
    AgentAnswer,
    AgentService,
    ConversationBody,
    ConversationPage,
    ConversationView,
    MessageBody,
)
from ductor_server.transports.rest.bodies import NO_BODY, NoBody, required
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS
from ductor_server.transports.rest.idempotency import IdempotencyKey, answered, checked_key


def provide_agent(request: Request[Any, Any, Any]) -> AgentService:
    """The chat agent's service."""
    return services_of(request).agent


class AgentController(Controller):
    """Conversations with the chat agent."""

    path = "/v1/agent/conversations"
    tags = ("agent",)
    dependencies = {"agent": Provide(provide_agent, sync_to_thread=False)}  # noqa: RUF012

    @post("/", status_code=201, responses=V1_ERRORS)
    async def create(
        self,
        tenant_id: NamedDependency[str],
        agent: NamedDependency[AgentService],
        data: JSONBody[ConversationBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AgentAnswer]:
        """Start a conversation `{model, connection?, title?, instructions?, message?,
        allow_mutations?}`; with a `message`, its first turn runs and is answered."""
        key = checked_key(idempotency_key)
        return answered(await agent.create(tenant_id, required(data), idempotency_key=key))

    @get("/", responses=V1_ERRORS)
    async def list_conversations(
        self,
        tenant_id: NamedDependency[str],
        agent: NamedDependency[AgentService],
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=200)] = 50,
    ) -> ConversationPage:
        """The tenant's conversations, newest first, a page at a time."""
        return await agent.list(tenant_id, cursor=cursor, limit=limit)

    @get("/{conversation_id:str}", responses=V1_ERRORS)
    async def get_conversation(
        self,
        conversation_id: FromPath[str],
        tenant_id: NamedDependency[str],
        agent: NamedDependency[AgentService],
    ) -> ConversationView:
        """A conversation: its messages, tool calls (arguments, results, status), turns
        and their cost."""
        return await agent.get(tenant_id, conversation_id)

    @post("/{conversation_id:str}/messages", status_code=201, responses=V1_ERRORS)
    async def post_message(
        self,
        conversation_id: FromPath[str],
        tenant_id: NamedDependency[str],
        agent: NamedDependency[AgentService],
        data: JSONBody[MessageBody | NoBody] = NO_BODY,
        idempotency_key: IdempotencyKey = None,
    ) -> Response[AgentAnswer]:
        """Send `{content?, confirm?, reject?, allow_mutations?}`: a message, decisions
        on the tool calls that wait, or both; the turn runs and is answered."""
        key = checked_key(idempotency_key)
        return answered(
            await agent.post_message(
                tenant_id, conversation_id, required(data), idempotency_key=key
            )
        )


__all__ = ["AgentController"]
