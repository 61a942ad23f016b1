"""Published workflow definitions by (tenant, slug, version), decoded once and cached.

Versions are immutable, so a cached definition never goes stale. Reads go
through the caller's transaction; this module writes nothing.
"""

from __future__ import annotations

from collections import OrderedDict

from ductor_core.definitions import WorkflowDefinition, definition_from_obj
from ductor_server.storage.protocol import Tx
from ductor_server.storage.records import WorkflowVersionRecord

_Key = tuple[str, str, int]


class WorkflowCatalog:
    """An LRU cache of decoded definitions in front of the store."""

    def __init__(self, max_entries: int = 2048) -> None:
        self._max = max_entries
        self._cache: OrderedDict[_Key, WorkflowDefinition] = OrderedDict()

    def decode(self, record: WorkflowVersionRecord) -> WorkflowDefinition:
        """The decoded definition of a stored version (cached)."""
        key = (record.tenant_id, record.family_slug, record.version)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        definition = definition_from_obj(record.definition)
        self._cache[key] = definition
        if len(self._cache) > self._max:
            self._cache.popitem(last=False)
        return definition

    async def definition(
        self, tx: Tx, tenant_id: str, family_slug: str, version: int
    ) -> WorkflowDefinition | None:
        """The definition of one version, or None if it is not published."""
        key = (tenant_id, family_slug, version)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        record = await tx.get_workflow_version(tenant_id, family_slug, version)
        return None if record is None else self.decode(record)

    async def resolve(
        self, tx: Tx, tenant_id: str, family_slug: str, version: int | None
    ) -> tuple[WorkflowVersionRecord, WorkflowDefinition] | None:
        """The record and definition at `version` (the latest if None), or None."""
        if version is None:
            record = await tx.get_latest_workflow_version(tenant_id, family_slug)
        else:
            record = await tx.get_workflow_version(tenant_id, family_slug, version)
        if record is None:
            return None
        return record, self.decode(record)
