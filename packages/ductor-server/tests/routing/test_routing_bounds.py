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


async def test_skill_label_and_attribute_names_are_bounded_like_every_id(api: Api) -> None:
    # A 20,000-character shadow label or a skill name holding a newline was stored,
    # then printed in every decision, report and explanation that names it.
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    await api.ok("POST", "/v1/pools", json={"id": "desk", "members": [{"worker": "ana"}]})
    long, bad = "x" * 257, "new\nline"
    cases = [
        ("/v1/workers", "workers", {"id": "ben", "skills": {long: 5}}, "$.skills", "/skills"),
        ("/v1/workers", "workers", {"id": "ben", "skills": {bad: 5}}, "$.skills", "/skills"),
        (
            "/v1/pools",
            "pools",
            {"id": "p", "shadows": [{"name": "least_loaded", "label": "x" * 20_000}]},
            "$.shadows[0].label",
            "/shadows/0/label",
        ),
        (
            "/v1/pools",
            "pools",
            {"id": "p", "strategy": {"name": "round_robin", "label": " "}},
            "$.strategy.label",
            "/strategy/label",
        ),
        (
            "/v1/rules",
            "rule_set",
            {"kinds": {"lead": {"attributes": {"ok": {}, bad: {}}}}},
            '$.kinds["lead"].attributes',
            "/kinds/lead/attributes",
        ),
        (
            "/v1/rules",
            "rule_set",
            {"enrichers": [{"attribute": "tab\there", "expr": "1"}]},
            "$.enrichers[0].attribute",
            "/enrichers/0/attribute",
        ),
    ]
    for path, field, body, json_path, pointer in cases:
        refused = assert_error(await api.call("POST", path, json=body), 422, "request.invalid")
        assert refused["details"]["path"] == json_path, refused
        checked = body if field == "rule_set" else [body]
        answer = await api.ok("POST", "/v1/routing/validate", json={field: checked})
        at = f"/{field}" if field == "rule_set" else f"/{field}/0"
        assert [p["pointer"] for p in answer["problems"]] == [at + pointer], answer
    assert [w["id"] for w in await api.ok("GET", "/v1/workers")] == ["ana"]
    assert [p["id"] for p in await api.ok("GET", "/v1/pools")] == ["desk"]
    assert await api.ok("GET", "/v1/rules/versions") == []
    # At the bound, each is taken.
    name = "n" * 256
    await api.ok("POST", "/v1/workers", json={"id": "ben", "skills": {name: 5}})
    shadow = {"name": "least_loaded", "label": name}
    await api.ok("POST", "/v1/pools", json={"id": "p", "shadows": [shadow]})
    rules = {
        "kinds": {"lead": {"attributes": {name: {}}}},
        "enrichers": [{"attribute": name, "expr": "1"}],
    }
    await api.ok("POST", "/v1/rules", json=rules)


async def _assigned(api: Api, routable_id: str) -> str:
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    await api.ok("POST", "/v1/pools", json={"id": "desk", "members": [{"worker": "ana"}]})
    await api.ok("POST", "/v1/rules", json={"kinds": {"lead": {}}, "default_pool": "desk"})
    decision = await api.ok("POST", "/v1/route", json={"id": routable_id, "kind": "lead"})
    assignment_id: str = decision["assignment_id"]
    return assignment_id


async def test_an_assignment_reason_is_at_most_ten_thousand_characters(api: Api) -> None:
    # As a cancel's: a reason goes whole into the assignment and a ROUTE step's error.
    assignment_id = await _assigned(api, "r1")
    path = f"/v1/assignments/{assignment_id}/reject"
    refused = assert_error(
        await api.call("POST", path, json={"reason": "r" * 10_001}), 422, "request.invalid"
    )
    assert refused["details"]["path"] == "$.reason", refused
    connect = await api.call(
        "POST",
        "/ductor.v1.RoutingService/RejectAssignment",
        json={"assignment_id": assignment_id, "reason": "r" * 10_001},
    )
    assert connect.status_code == 400, connect.text
    assert connect.json()["code"] == "invalid_argument", connect.text
    debug = connect.json()["details"][0]["debug"]
    assert (debug["code"], debug["details"]["path"]) == ("request.invalid", "$.reason"), debug
    assert (await api.ok("GET", f"/v1/assignments/{assignment_id}"))["status"] == "assigned"
    rejected = await api.ok("POST", path, json={"reason": "r" * 10_000})
    assert rejected["status"] == "rejected"


async def test_a_routes_pool_is_held_to_the_pool_id_rule(api: Api) -> None:
    # No pool can have such an id: it was looked up and answered 404 pool.not_found.
    await _assigned(api, "r1")
    for pool in ("p" * 257, "p" * 200_000, "desk\n", "\u007f", " "):
        body = {"id": "r2", "kind": "lead", "pool": pool}
        refused = assert_error(
            await api.call("POST", "/v1/route", json=body), 422, "request.invalid"
        )
        assert refused["details"]["path"] == "$.pool", refused
    body = {"id": "r2", "kind": "lead", "pool": "p" * 256}
    assert_error(await api.call("POST", "/v1/route", json=body), 404, "pool.not_found")
    decision = await api.ok("POST", "/v1/route", json={**body, "pool": "desk"})
    assert decision["worker"] == "ana", decision


async def test_a_routes_excluded_workers_are_held_to_the_worker_id_rule(api: Api) -> None:
    # No worker can have such an id: as the routable's other ids, it is refused, not
    # taken in (a 200 KB one was routed around like any other).
    await _assigned(api, "r1")
    for worker in ("w" * 257, "w" * 200_000, "ana\n", "\u007f", " ", ""):
        body = {"id": "r2", "kind": "lead", "exclude": ["ben", worker]}
        refused = assert_error(
            await api.call("POST", "/v1/route", json=body), 422, "request.invalid"
        )
        assert refused["details"]["path"] == "$.exclude[1]", refused
        assert len(refused["message"]) < 200, refused["message"]
    decisions = await api.ok("GET", "/v1/assignments", params={"routable_id": "r2"})
    assert decisions == [], decisions
    decision = await api.ok("POST", "/v1/route", json={"id": "r2", "kind": "lead"})
    assert decision["worker"] == "ana", decision
    excluded = {"id": "r3", "kind": "lead", "exclude": ["w" * 256, "ana"]}
    assert (await api.ok("POST", "/v1/route", json=excluded))["worker"] is None
