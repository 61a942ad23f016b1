"""`traced`: a span around a service operation of one tenant."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from ductor_server.telemetry.instruments import tracer

P = ParamSpec("P")
R = TypeVar("R")


def traced(
    name: str,
) -> Callable[[Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Run a service method `(self, tenant_id, ...)` inside an INTERNAL span `name`
    carrying its `ductor.tenant`; the method may add attributes to the current span."""

    def decorate(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        @functools.wraps(method)
        async def call(*args: P.args, **kwargs: P.kwargs) -> R:
            tenant = args[1] if len(args) > 1 else kwargs.get("tenant_id")
            with tracer.start_as_current_span(name, attributes={"ductor.tenant": str(tenant)}):
                return await method(*args, **kwargs)

        return call

    return decorate


__all__ = ["traced"]
