"""The guard that refuses a NUL character in a path or query parameter before any
handler reads one. No store can look such a value up (PostgreSQL text cannot hold
it), so both backends answer the same `422 request.invalid` naming the parameter.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from ductor_server.errors import RequestInvalid


async def refuse_nul_parameters(
    connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler
) -> None:
    """Guard: no path or query parameter (name or value) holds a NUL character.

    Raises:
        RequestInvalid: `details.path` names the parameter.
    """
    for name, value in connection.path_params.items():
        if isinstance(value, str) and "\x00" in value:
            raise _refused(name)
    for name, value in connection.query_params.multi_items():
        if "\x00" in name or "\x00" in value:
            raise _refused(name)


def _refused(name: str) -> RequestInvalid:
    reason = "contains a NUL character"
    return RequestInvalid(
        f"parameter {name[:100]!r} {reason}", details={"path": name[:100], "reason": reason}
    )


__all__ = ["refuse_nul_parameters"]
