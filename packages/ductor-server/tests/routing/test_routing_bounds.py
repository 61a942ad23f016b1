"""Routing configuration and requests held to their bounds over the API, on both
backends: kind attribute ranges, names, reasons and a route's pool."""

from __future__ import annotations

from .conftest import Api
from .test_routing_api import assert_error


async def test_a_kind_attribute_whose_minimum_is_above_its_maximum_is_refused(api: Api) -> None:
    kinds = {"lead": {"attributes": {"n": {"type": "number", "minimum": 5, "maximum": 1}}}}
    body = assert_error(
        await api.call("POST", "/v1/rules", json={"kinds": kinds}), 422, "routing.config"
    )
    assert [p["pointer"] for p in body["details"]] == ["/kinds/lead/attributes/n"], body
    checked = await api.ok("POST", "/v1/routing/validate", json={"rule_set": {"kinds": kinds}})
    assert [p["pointer"] for p in checked["problems"]] == ["/rule_set/kinds/lead/attributes/n"]
    assert await api.ok("GET", "/v1/rules/versions") == []
    kinds["lead"]["attributes"]["n"]["maximum"] = 5
    await api.ok("POST", "/v1/rules", json={"kinds": kinds})
