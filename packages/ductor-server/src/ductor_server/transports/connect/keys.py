"""`KeyService`: the methods of `/v1/keys`, the calling tenant's API keys, each calling
the `KeysService` function its REST route calls (every one needs the `admin` scope).

The operator's `/v1/tenants` routes are not here: they take the operator key, not a
tenant's API key (docs/connect.md, "Left out").
"""

from __future__ import annotations

from ductor_server.services.keys import CreatedKey, CreateKeyBody, KeyPage, KeyView
from ductor_server.transports.connect.method import (
    Cursor,
    Id,
    Limit500,
    Method,
    Req,
    caller_method,
    method,
)


class ListKeysRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The tenant's keys newest first, paged by cursor."""

    cursor: Cursor | None = None
    limit: Limit500 = 50


class KeyRequest(Req, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One of the tenant's keys."""

    key_id: Id


KEYS = "KeyService"

METHODS: tuple[Method, ...] = (
    caller_method(
        KEYS,
        "CreateKey",
        CreateKeyBody,
        CreatedKey,
        # The caller itself: a key may not make a key with a scope it lacks.
        lambda s, c, r, k: s.keys.create(c, r, idempotency_key=k),
        rest="POST /v1/keys",
        mutates=True,
        doc="Create a key with no scope the calling key lacks; its secret is shown this once.",
    ),
    method(
        KEYS,
        "ListKeys",
        ListKeysRequest,
        KeyPage,
        lambda s, t, r, k: s.keys.list(t, cursor=r.cursor, limit=r.limit),
        rest="GET /v1/keys",
        doc="The tenant's keys newest first (revoked and expired ones too), never a secret.",
    ),
    method(
        KEYS,
        "GetKey",
        KeyRequest,
        KeyView,
        lambda s, t, r, k: s.keys.get(t, r.key_id),
        rest="GET /v1/keys/{key_id}",
        doc="One of the tenant's keys.",
    ),
    method(
        KEYS,
        "RevokeKey",
        KeyRequest,
        None,
        lambda s, t, r, k: s.keys.revoke(t, r.key_id),
        rest="DELETE /v1/keys/{key_id}",
        doc="Revoke a key (not the tenant's last live admin key).",
    ),
)
"""The methods of the key service."""


__all__ = ["KEYS", "METHODS"]
