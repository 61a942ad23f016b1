"""The Connect-RPC transport: every unary operation of the REST API as a method of a
`ductor.v1` service, served by the `connectrpc` library with a msgspec JSON codec
and mounted in the Litestar app (`POST /ductor.v1.<Service>/<Method>`). The
`.proto` files in `proto/ductor/v1/` are written from the same method table by
`schema.py`. See docs/connect.md."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ductor_server.transports.connect import (
    agent,
    integrations,
    keys,
    routing,
    runs,
    settlement,
)
from ductor_server.transports.connect.endpoint import ConnectEndpoint
from ductor_server.transports.connect.method import PACKAGE, Method

if TYPE_CHECKING:
    from ductor_server.transports.connect.server import connect_error

METHODS: tuple[Method, ...] = (
    *runs.METHODS,
    *routing.METHODS,
    *settlement.METHODS,
    *integrations.METHODS,
    *agent.METHODS,
    *keys.METHODS,
)
"""Every Connect method, by service in the order of the docs."""

__all__ = ["METHODS", "PACKAGE", "ConnectEndpoint", "Method", "connect_error"]


def __getattr__(name: str) -> Any:
    # `connect_error` needs connectrpc, which loads on the first Connect request.
    if name == "connect_error":
        from ductor_server.transports.connect.server import connect_error

        return connect_error
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
