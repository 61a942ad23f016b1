"""How the server knows the bridge signing keys: the environment, read at the edge.

`DUCTOR_BRIDGE_SIGNING_KEY` (primary) and `DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK`
(optional, for rotation) are shared by the server and the tenant's apps.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ductor.protocol import SigningKeys

KEY_ENV = "DUCTOR_BRIDGE_SIGNING_KEY"
"""Environment variable holding the primary bridge signing key."""

FALLBACK_ENV = "DUCTOR_BRIDGE_SIGNING_KEY_FALLBACK"
"""Environment variable holding the previous key during a rotation."""


def signing_keys_from_env(env: Mapping[str, str] | None = None) -> SigningKeys | None:
    """The bridge signing keys configured in `env` (default: the process env), or None."""
    values = os.environ if env is None else env
    primary = values.get(KEY_ENV, "").strip()
    if not primary:
        return None
    return SigningKeys(primary, values.get(FALLBACK_ENV, "").strip() or None)


__all__ = ["FALLBACK_ENV", "KEY_ENV", "signing_keys_from_env"]
