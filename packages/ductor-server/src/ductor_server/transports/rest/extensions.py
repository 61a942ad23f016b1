"""`GET /v1/extensions`: the extension points and the plugins this process loaded,
with the ones that failed and why. Reads what the app was built with; writes nothing.
"""

from __future__ import annotations

from typing import Any

from litestar import Controller, Request, get

from ductor_server.extensions import Extensions, ExtensionsView
from ductor_server.transports.rest.errors import V1_ERRORS


class ExtensionsController(Controller):
    """The installed extensions (the same for every tenant)."""

    path = "/v1/extensions"
    tags = ("extensions",)

    @get("/", responses=V1_ERRORS)
    async def list_extensions(self, request: Request[Any, Any, Any]) -> ExtensionsView:
        """Every extension point (group, contract) with the extensions it loaded
        (name, distribution, version, object path), and every load failure."""
        extensions: Extensions = request.app.state.extensions
        return extensions.view()
