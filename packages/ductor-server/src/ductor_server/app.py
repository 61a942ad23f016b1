"""The Litestar application factory. Handlers stay thin: parse, call, serialize."""

from __future__ import annotations

from litestar import Litestar, get
from litestar.openapi import OpenAPIConfig

from ductor_server.settings import Settings


@get("/healthz", sync_to_thread=False)
def healthz() -> dict[str, str]:
    """Liveness: the process is up and serving."""
    return {"status": "ok"}


def create_app(settings: Settings | None = None) -> Litestar:
    """Build the Ductor API application for `settings`."""
    settings = settings or Settings()
    app = Litestar(
        route_handlers=[healthz],
        openapi_config=OpenAPIConfig(title="Ductor", version="0.1.0", path="/docs"),
    )
    app.state.settings = settings
    return app
