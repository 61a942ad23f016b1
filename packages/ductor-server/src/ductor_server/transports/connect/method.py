"""What one Connect-RPC method is: its service, name, request and response types and
the service call it makes; the request structs several methods share.

A method's request is a msgspec struct decoded strictly from the JSON body (an
unknown field is an error, as on REST); its response type is what the service
returns: a struct is sent as the response message itself, a list as `{"items":
[...]}`, None as `{}`. `schema.py` writes the `.proto` files from these same
types, so the schema and the server cannot drift. Nothing here touches HTTP.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar, get_origin

import msgspec

from ductor_server.services import Services
from ductor_server.services.keys import Caller
from ductor_server.transports.rest.bodies import INT64_MAX

PACKAGE = "ductor.v1"
"""The protobuf package of every service."""

Call = Callable[[Services, str, Any, "str | None"], Awaitable[Any]]
"""A method's body: (services, tenant, decoded request, idempotency key) -> a view, an
`Answer`, a list of views or None."""
CallerCall = Callable[[Services, Caller, Any, "str | None"], Awaitable[Any]]
"""The body of a method that needs the calling key itself, not only its tenant
(`CreateKey` refuses a scope the key lacks): the `Caller` in place of the tenant."""

Id = Annotated[str, msgspec.Meta(min_length=1)]
"""An id or name a REST call takes in its path. No length is checked here: the
service checks it as it does for REST (an id longer than any stored is not found,
a name too long to store is refused with the service's message), so that an object
made with a 256-character id is reached the same way over both transports."""
Version = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
Cursor = Annotated[str, msgspec.Meta(max_length=1024)]
Limit200 = Annotated[int, msgspec.Meta(ge=1, le=200)]
Limit500 = Annotated[int, msgspec.Meta(ge=1, le=500)]
Limit1000 = Annotated[int, msgspec.Meta(ge=1, le=1000)]
Limit100k = Annotated[int, msgspec.Meta(ge=1, le=100_000)]


class Req(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of request messages: an unknown field is an error, not ignored."""


class Empty(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A request or response without fields."""


class Items(msgspec.Struct, frozen=True, kw_only=True):
    """The response of a method whose REST route answers a JSON array."""

    items: list[Any]


S = TypeVar("S", bound=msgspec.Struct)


def body_of(request: msgspec.Struct, body: type[S]) -> S:
    """The REST body `body` within `request`, a request struct that subclasses it to
    add the path's fields (so the service never sees those)."""
    return body(**{name: getattr(request, name) for name in body.__struct_fields__})


@dataclass(frozen=True, kw_only=True)
class Method:
    """One unary RPC: `POST /ductor.v1.<service>/<name>`.

    Attributes:
        service: the service's name (`RunService`).
        name: the method's name (`TriggerRun`).
        request: the struct its request is decoded into.
        response: the type the call answers (a struct, `list[X]`, or None).
        call: what it does, given the caller (`method` makes it from a call that
            takes the caller's tenant only).
        rest: the REST call it mirrors (`POST /v1/runs`).
        mutates: it changes something (it then honours `Idempotency-Key`).
        doc: one line for the schema and the docs.
    """

    service: str
    name: str
    request: type[msgspec.Struct]
    response: Any
    call: CallerCall
    rest: str
    mutates: bool = False
    doc: str = ""

    @property
    def path(self) -> str:
        """The procedure's path."""
        return f"/{PACKAGE}.{self.service}/{self.name}"

    @property
    def read_only(self) -> bool:
        """It changes nothing (its REST route is a GET): Connect may call it by GET."""
        return self.rest.startswith("GET ")

    @property
    def listed(self) -> bool:
        """The REST route answers an array, sent here as `{"items": [...]}`."""
        return get_origin(self.response) is list

    def message(self, value: Any) -> Any:
        """The response message of the call's answer `value`."""
        if self.response is None:
            return Empty()
        if self.listed:
            return Items(items=value)
        return value


def method(
    service: str,
    name: str,
    request: type[msgspec.Struct],
    response: Any,
    call: Call,
    *,
    rest: str,
    mutates: bool = False,
    doc: str = "",
) -> Method:
    """A `Method` whose call is given the caller's tenant (positional for the tables of
    each area)."""

    def by_tenant(
        services: Services, caller: Caller, request: Any, key: str | None
    ) -> Awaitable[Any]:
        return call(services, caller.tenant_id, request, key)

    return caller_method(
        service, name, request, response, by_tenant, rest=rest, mutates=mutates, doc=doc
    )


def caller_method(
    service: str,
    name: str,
    request: type[msgspec.Struct],
    response: Any,
    call: CallerCall,
    *,
    rest: str,
    mutates: bool = False,
    doc: str = "",
) -> Method:
    """A `Method` whose call is given the whole `Caller` (its key's id and scopes)."""
    return Method(
        service=service,
        name=name,
        request=request,
        response=response,
        call=call,
        rest=rest,
        mutates=mutates,
        doc=doc,
    )


__all__ = [
    "PACKAGE",
    "Call",
    "CallerCall",
    "Cursor",
    "Empty",
    "Id",
    "Items",
    "Limit100k",
    "Limit200",
    "Limit500",
    "Limit1000",
    "Method",
    "Req",
    "Version",
    "body_of",
    "caller_method",
    "method",
]
