"""Receipt resources: `GET /v1/receipts[/{id}]` (tenant-scoped) and the public key set at
`GET /.well-known/ductor-keys` (no auth). Thin handlers over `ReceiptService`.

Another tenant's receipt is 404. The key set holds public keys only.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Controller, MediaType, Request, Response, get
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, FromQuery, QueryParameter

from ductor_server.services.receipts import (
    PublicKeySet,
    ReceiptPageView,
    ReceiptService,
    ReceiptView,
)
from ductor_server.transports.rest.dependencies import services_of
from ductor_server.transports.rest.errors import V1_ERRORS

KEYS_PATH = "/.well-known/ductor-keys"
"""Where the public receipt keys are published."""


def provide_receipts(request: Request[Any, Any, Any]) -> ReceiptService:
    """The receipt service."""
    return services_of(request).receipts


_RECEIPTS = {"receipts": Provide(provide_receipts, sync_to_thread=False)}


class ReceiptsController(Controller):
    """Signed receipts of cleared assignments and runs: read them."""

    path = "/v1/receipts"
    tags = ("receipts",)
    dependencies = _RECEIPTS

    @get("/", responses=V1_ERRORS)
    async def list_receipts(
        self,
        tenant_id: NamedDependency[str],
        receipts: NamedDependency[ReceiptService],
        subject: FromQuery[str | None] = None,
        kind: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
        limit: Annotated[int, QueryParameter(ge=1, le=500)] = 50,
    ) -> ReceiptPageView:
        """Receipts newest first; `subject=KIND:ID` keeps one subject's (`run:run_1`),
        `kind` one kind's (`assignment` or `run`), `cursor` pages."""
        return await receipts.list(
            tenant_id, subject=subject, kind=kind, cursor=cursor, limit=limit
        )

    @get("/{receipt_id:str}", responses=V1_ERRORS)
    async def get_receipt(
        self,
        receipt_id: FromPath[str],
        tenant_id: NamedDependency[str],
        receipts: NamedDependency[ReceiptService],
    ) -> ReceiptView:
        """One receipt: its DSSE `envelope` (what `ductor receipts verify` checks), the
        decoded `receipt`, the signing `key_id` and the payload's `digest`."""
        return await receipts.get(tenant_id, receipt_id)


@get(KEYS_PATH, tags=["receipts"], sync_to_thread=False)
def receipt_keys(request: Request[Any, Any, Any]) -> Response[PublicKeySet]:
    """The public keys receipts are signed with, as a JWK Set (key id → Ed25519 key).
    No auth: verifiers fetch it."""
    return Response(
        content=services_of(request).receipts.public_key_set(),
        media_type=MediaType.JSON,
        headers={"Cache-Control": "public, max-age=60"},
    )


__all__ = ["KEYS_PATH", "ReceiptsController", "provide_receipts", "receipt_keys"]
