"""The `Target` of `ductor apply`: the server's public REST API, with an API key."""

from __future__ import annotations

from typing import Any

import httpx

from ductor_server.manifests.plan import Found, TargetError, path_pointer


class RestTarget:
    """A server reached over `/v1/...` as the tenant of `api_key`."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url
        self._http = httpx.AsyncClient(
            base_url=url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _call(
        self, method: str, path: str, body: Any = None, *, missing_ok: bool = False
    ) -> Any:
        try:
            response = await self._http.request(
                method, path, json=body if body is not None else None
            )
        except httpx.TransportError as exc:
            raise TargetError(
                "client.unreachable", f"cannot reach the server at {self.url} ({exc})"
            ) from exc
        if missing_ok and response.status_code == 404:
            return None
        try:
            payload = response.json() if response.content else None
        except ValueError:
            payload = None
        if response.status_code >= 400:
            if isinstance(payload, dict) and "code" in payload:
                raise TargetError(
                    str(payload["code"]), str(payload.get("message", "")), payload.get("details")
                )
            raise TargetError("http.error", f"HTTP {response.status_code}: {response.text[:200]}")
        return payload

    async def workflow_hashes(self, slug: str) -> list[str]:
        family = await self._call("GET", f"/v1/workflows/{_segment(slug)}", missing_ok=True)
        if family is None:
            return []
        return [v["hash"] for v in family["versions"]]

    async def validate_workflow(self, definition: Any) -> list[Found]:
        report = await self._call("POST", "/v1/workflows/validate", definition)
        return [
            Found(p.get("pointer", ""), p.get("message", ""), p.get("code", ""))
            for p in report.get("problems", [])
        ]

    async def publish_workflow(self, definition: Any) -> tuple[int, bool]:
        published = await self._call("POST", "/v1/workflows", definition)
        return int(published["version"]), bool(published["created"])

    async def routing_state(self) -> tuple[list[Any], list[Any], Any]:
        workers = await self._call("GET", "/v1/workers")
        pools = await self._call("GET", "/v1/pools")
        rules = await self._call("GET", "/v1/rules", missing_ok=True)
        return workers, pools, None if rules is None else rules["rule_set"]

    async def validate_routing(
        self, workers: list[Any], pools: list[Any], rule_set: Any
    ) -> list[Found]:
        body: dict[str, Any] = {"workers": workers, "pools": pools}
        if rule_set is not None:
            body["rule_set"] = rule_set
        report = await self._call("POST", "/v1/routing/validate", body)
        return [Found(p["pointer"], p["message"]) for p in report["problems"]]

    async def put_worker(self, spec: Any) -> None:
        await self._call("POST", "/v1/workers", spec)

    async def put_pool(self, spec: Any) -> None:
        await self._call("POST", "/v1/pools", spec)

    async def publish_rules(self, spec: Any) -> int:
        published = await self._call("POST", "/v1/rules", spec)
        return int(published["version"])

    async def connections(self) -> list[Any]:
        found: list[Any] = await self._call("GET", "/v1/connections")
        return found

    async def providers(self) -> list[Any]:
        found: list[Any] = await self._call("GET", "/v1/providers")
        return found

    async def validate_connection(self, body: Any) -> list[Found]:
        try:
            report = await self._call("POST", "/v1/connections/validate", body)
        except TargetError as exc:
            if exc.code != "request.invalid" or not isinstance(exc.details, dict):
                raise
            return [path_pointer(str(exc.details.get("reason", "")), exc.details.get("path"))]
        return [Found(p["pointer"], p["message"]) for p in report["problems"]]

    async def create_connection(self, body: Any) -> None:
        await self._call("POST", "/v1/connections", body)

    async def update_connection(self, name: str, patch: Any) -> None:
        await self._call("PATCH", f"/v1/connections/{_segment(name)}", patch)


def _segment(name: str) -> str:
    """`name` as one path segment."""
    from urllib.parse import quote

    return quote(name, safe="")


__all__ = ["RestTarget"]
