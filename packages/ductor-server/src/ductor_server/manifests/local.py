"""The `Target` of `ductor serve --seed`: the services of the starting process, for one
tenant, with no transport in between."""

from __future__ import annotations

from typing import Any

import msgspec

from ductor_core.errors import DuctorError
from ductor_routing import Pool, Worker
from ductor_server.manifests.plan import Found, TargetError, path_pointer
from ductor_server.services import Services
from ductor_server.services.connections import ConnectionBody, ConnectionPatch
from ductor_server.services.routing import ConfigCheckBody, RulesBody


class ServicesTarget:
    """The services of this process, as the tenant `tenant_id`."""

    def __init__(self, services: Services, tenant_id: str) -> None:
        self._services = services
        self._tenant = tenant_id

    async def workflow_hashes(self, slug: str) -> list[str]:
        try:
            family = await self._services.workflows.family(self._tenant, slug)
        except DuctorError as exc:
            if exc.code == "workflow.not_found":
                return []
            raise _refused(exc) from exc
        return [v.hash for v in family.versions]

    async def validate_workflow(self, definition: Any) -> list[Found]:
        report = await self._services.workflows.validate(self._tenant, definition)
        return [Found(p.pointer, p.message, p.code) for p in report.problems]

    async def publish_workflow(self, definition: Any) -> tuple[int, bool]:
        answer = await _call(self._services.workflows.publish(self._tenant, definition))
        return answer.value.version, answer.value.created

    async def routing_state(self) -> tuple[list[Any], list[Any], Any]:
        routing = self._services.routing
        workers = msgspec.to_builtins(await routing.list_workers(self._tenant))
        pools = msgspec.to_builtins(await routing.list_pools(self._tenant))
        try:
            rules = await routing.get_rules(self._tenant)
        except DuctorError as exc:
            if exc.code != "rule_set.not_found":
                raise _refused(exc) from exc
            return workers, pools, None
        return workers, pools, msgspec.to_builtins(rules.rule_set)

    async def validate_routing(
        self, workers: list[Any], pools: list[Any], rule_set: Any
    ) -> list[Found]:
        body = ConfigCheckBody(workers=workers, pools=pools, rule_set=rule_set)
        report = await _call(self._services.routing.check_config(self._tenant, body))
        return [Found(p.pointer, p.message) for p in report.problems]

    async def put_worker(self, spec: Any) -> None:
        worker = _convert(spec, Worker)
        await _call(self._services.routing.put_worker(self._tenant, worker))

    async def put_pool(self, spec: Any) -> None:
        await _call(self._services.routing.put_pool(self._tenant, _convert(spec, Pool)))

    async def publish_rules(self, spec: Any) -> int:
        rules = _convert(spec, RulesBody)
        answer = await _call(self._services.routing.publish_rules(self._tenant, rules))
        version: int = answer.value.version
        return version

    async def connections(self) -> list[Any]:
        found = await self._services.connections.list_connections(self._tenant)
        return list(msgspec.to_builtins(found))

    async def providers(self) -> list[Any]:
        return list(msgspec.to_builtins(self._services.connections.list_providers()))

    async def validate_connection(self, body: Any) -> list[Found]:
        try:
            decoded = msgspec.convert(body, ConnectionBody)
        except msgspec.ValidationError as exc:
            return [path_pointer(str(exc))]
        return [
            Found(p["pointer"], p["message"]) for p in self._services.connections.check(decoded)
        ]

    async def create_connection(self, body: Any) -> None:
        decoded = _convert(body, ConnectionBody)
        await _call(self._services.connections.create(self._tenant, decoded))

    async def update_connection(self, name: str, patch: Any) -> None:
        decoded = _convert(patch, ConnectionPatch)
        await _call(self._services.connections.update(self._tenant, name, decoded))


def _refused(exc: DuctorError) -> TargetError:
    return TargetError(exc.code, exc.message, exc.details)


async def _call(pending: Any) -> Any:
    try:
        return await pending
    except DuctorError as exc:
        raise _refused(exc) from exc


def _convert(value: Any, into: type[Any]) -> Any:
    try:
        return msgspec.convert(value, into)
    except msgspec.ValidationError as exc:
        raise TargetError("request.invalid", str(exc)) from exc


__all__ = ["ServicesTarget"]
