"""Routing over the REST API on both backends: configuration, decisions, assignments,
idempotency, bad input and tenancy."""

from __future__ import annotations

from typing import Any

from ductor_server.transports.rest.errors import STATUS_BY_CODE

from .conftest import Api

LEAD_KIND = {
    "lead": {
        "attributes": {"state": {"type": "string", "required": True}},
        "require_price": False,
    }
}


def assert_error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert set(body) == {"code", "message", "details"}, body
    assert body["code"] == code, body
    assert STATUS_BY_CODE.get(code, status) == status
    return body


async def setup_desk(api: Api, *, cap: int = 2) -> None:
    for worker in ("ana", "ben"):
        await api.ok("POST", "/v1/workers", json={"id": worker, "capacity": {"leads": 5}})
    await api.ok(
        "POST",
        "/v1/pools",
        json={
            "id": "desk",
            "channel": "leads",
            "strategy": {"name": "round_robin"},
            "shadows": [{"name": "least_loaded"}],
            "members": [
                {"worker": "ana", "caps": [{"window": "day", "limit": cap}]},
                {"worker": "ben", "caps": [{"window": "day", "limit": cap}]},
            ],
        },
    )
    await api.ok(
        "POST",
        "/v1/rules",
        json={
            "id": "main",
            "kinds": LEAD_KIND,
            "rules": [
                {
                    "id": "ca",
                    "pool": "desk",
                    "match": [{"attribute": "state", "value": "CA"}],
                }
            ],
        },
    )


async def test_route_assigns_explains_and_enforces_caps(api: Api) -> None:
    await setup_desk(api, cap=2)
    picks = []
    for i in range(5):
        decision = await api.ok(
            "POST", "/v1/route", json={"id": f"l{i}", "kind": "lead", "attributes": {"state": "CA"}}
        )
        picks.append(decision["worker"])
        stored = await api.ok("GET", f"/v1/decisions/{decision['id']}")
        assert stored == decision
    # Two each (round robin), then both are at their daily cap.
    assert sorted(p for p in picks if p) == ["ana", "ana", "ben", "ben"]
    assert picks[4] is None
    last = await api.ok("GET", f"/v1/decisions/{decision['id']}")
    assert last["outcome"] == "unassigned"
    assert last["assignment_id"] is None
    explanation = last["explanation"]
    assert explanation["rule"] == "ca"
    assert explanation["rule_set"] == "main"
    assert explanation["rule_set_version"] == 1
    assert {tuple(e["workers"]) for e in explanation["excluded"] if e["reason"] == "cap"} == {
        ("ana", "ben")
    }


async def test_assignments_page_on_with_after(api: Api) -> None:
    await setup_desk(api, cap=10)
    for i in range(5):
        lead = {"id": f"p{i}", "kind": "lead", "attributes": {"state": "CA"}}
        assert (await api.ok("POST", "/v1/route", json=lead))["outcome"] == "assigned"
    everything = await api.ok("GET", "/v1/assignments?limit=1000")
    assert [a["routable_id"] for a in everything] == [f"p{i}" for i in range(5)]
    pages, after = [], None
    while True:
        query = "/v1/assignments?limit=2" + (f"&after={after}" if after else "")
        page = await api.ok("GET", query)
        if not page:
            break
        pages.append([a["routable_id"] for a in page])
        after = page[-1]["id"]
    assert pages == [["p0", "p1"], ["p2", "p3"], ["p4"]]
    # Empty filters are absent ones: the first page of everything.
    blank = await api.ok("GET", "/v1/assignments?routable_id=&worker=&status=&after=&limit=2")
    assert [a["routable_id"] for a in blank] == ["p0", "p1"]
    # Filters hold across pages: ana's inbox, one at a time.
    ana = [a["id"] for a in everything if a["worker"] == "ana"]
    page = await api.ok("GET", f"/v1/assignments?worker=ana&limit=1&after={ana[0]}")
    assert [a["id"] for a in page] == ana[1:2]
    # An id that names no assignment of the tenant is refused, not taken as the start.
    unknown = await api.call("GET", "/v1/assignments?after=asg_nope")
    assert_error(unknown, 422, "request.invalid")
    assert unknown.json()["details"]["path"] == "after"
    assert_error(
        await api.call("GET", f"/v1/assignments?after={ana[0]}", as_b=True), 422, "request.invalid"
    )


async def test_unmatched_routable_is_unassigned_with_the_rules_that_missed(api: Api) -> None:
    await setup_desk(api)
    decision = await api.ok(
        "POST", "/v1/route", json={"id": "x", "kind": "lead", "attributes": {"state": "NV"}}
    )
    assert decision["outcome"] == "unassigned"
    assert [t["rule"] for t in decision["explanation"]["rules_not_matched"]] == ["ca"]


async def test_assignment_lifecycle_releases_load_and_caps(api: Api) -> None:
    await setup_desk(api, cap=1)
    first = await api.ok(
        "POST", "/v1/route", json={"id": "a", "kind": "lead", "attributes": {"state": "CA"}}
    )
    aid = first["assignment_id"]
    assignment = await api.ok("GET", f"/v1/assignments/{aid}")
    assert assignment["status"] == "assigned"
    assert assignment["worker"] == first["worker"]
    accepted = await api.ok("POST", f"/v1/assignments/{aid}/accept")
    assert accepted["status"] == "accepted"
    assert_error(
        await api.call("POST", f"/v1/assignments/{aid}/accept"), 409, "routing.assignment_state"
    )
    rejected = await api.ok("POST", f"/v1/assignments/{aid}/reject", json={"reason": "busy"})
    assert rejected["status"] == "rejected"
    assert rejected["reason"] == "busy"
    # The reject gave the cap back: both workers can take one more each.
    workers = set()
    for i in range(2):
        d = await api.ok(
            "POST", "/v1/route", json={"id": f"b{i}", "kind": "lead", "attributes": {"state": "CA"}}
        )
        workers.add(d["worker"])
    assert workers == {"ana", "ben"}
    done = await api.ok(
        "POST", f"/v1/assignments/{d['assignment_id']}/complete", json={"result": {"won": True}}
    )
    assert done["status"] == "completed"
    assert done["result"] == {"won": True}
    listed = await api.ok("GET", "/v1/assignments", params={"status": "completed"})
    assert [a["id"] for a in listed] == [d["assignment_id"]]
    unknown = assert_error(
        await api.call("GET", "/v1/assignments", params={"status": "done"}),
        422,
        "request.invalid",
    )
    assert unknown["details"]["allowed"] == [
        "assigned",
        "accepted",
        "completed",
        "rejected",
        "expired",
        "returned",
    ]
    assert_error(
        await api.call("POST", f"/v1/assignments/{d['assignment_id']}/reject"),
        409,
        "routing.assignment_state",
    )


async def test_rules_are_versioned_and_take_effect_without_restart(api: Api) -> None:
    await setup_desk(api)
    await api.ok("POST", "/v1/workers", json={"id": "cy"})
    await api.ok("POST", "/v1/pools", json={"id": "west", "members": [{"worker": "cy"}]})
    published = await api.ok(
        "POST",
        "/v1/rules",
        json={
            "id": "main",
            "kinds": LEAD_KIND,
            "default_pool": "west",
            "rules": [
                {"id": "ca", "pool": "desk", "match": [{"attribute": "state", "value": "CA"}]}
            ],
        },
    )
    assert published["version"] == 2
    d = await api.ok(
        "POST", "/v1/route", json={"id": "n", "kind": "lead", "attributes": {"state": "NV"}}
    )
    assert (d["worker"], d["explanation"]["rule"], d["explanation"]["rule_set_version"]) == (
        "cy",
        "default",
        2,
    )
    versions = await api.ok("GET", "/v1/rules/versions")
    assert [v["version"] for v in versions] == [2, 1]
    first = await api.ok("GET", "/v1/rules/versions/1")
    assert first["rule_set"]["default_pool"] is None
    assert (await api.ok("GET", "/v1/rules"))["version"] == 2
    # A worker change is seen by the next decision: cy goes offline.
    await api.ok("POST", "/v1/workers", json={"id": "cy", "availability": "offline"})
    d = await api.ok(
        "POST", "/v1/route", json={"id": "n2", "kind": "lead", "attributes": {"state": "NV"}}
    )
    assert d["outcome"] == "unassigned"
    assert (
        d["explanation"]["excluded"][0]
        == {
            "reason": "unavailable",
            "detail": "offline",
            "workers": ["cy"],
        }
        or d["explanation"]["excluded"][0]["reason"] == "unavailable"
    )


async def test_bad_configuration_is_refused_and_nothing_changes(api: Api) -> None:
    await setup_desk(api)
    # A pool with an unknown member, a rule with an unknown pool, bad CEL.
    body = assert_error(
        await api.call("POST", "/v1/pools", json={"id": "p", "members": [{"worker": "ghost"}]}),
        422,
        "routing.config",
    )
    # Pointers lead into the request body, not into the assembled configuration.
    assert [p["pointer"] for p in body["details"]] == ["/members/0/worker"]
    # A worker's skills are 0 to 100; its weight and capacities are not negative.
    body = assert_error(
        await api.call(
            "POST",
            "/v1/workers",
            json={"id": "ana", "skills": {"sql": 150}, "weight": -1, "capacity": {"leads": -1}},
        ),
        422,
        "routing.config",
    )
    assert [p["pointer"] for p in body["details"]] == [
        "/skills/sql",
        "/weight",
        "/capacity/leads",
    ]
    assert (await api.ok("GET", "/v1/workers/ana"))["skills"] == {}
    body = assert_error(
        await api.call(
            "POST",
            "/v1/rules",
            json={"rules": [{"id": "r", "pool": "nowhere"}], "default_pool": "gone"},
        ),
        422,
        "routing.config",
    )
    assert [p["pointer"] for p in body["details"]] == ["/rules/0/pool", "/default_pool"]
    body = assert_error(
        await api.call(
            "POST", "/v1/rules", json={"rules": [{"id": "r", "pool": "desk", "when": "1 +"}]}
        ),
        422,
        "routing.config",
    )
    assert [p["pointer"] for p in body["details"]] == ["/rules/0/when"]
    # Deleting a worker a pool still lists, or a pool a rule picks, is refused as in use
    # (pointing into the configuration) and nothing changes.
    body = assert_error(await api.call("DELETE", "/v1/workers/ana"), 409, "routing.in_use")
    assert "pool 'desk'" in body["message"], body
    assert body["details"]["used_by"] == [{"pool": "desk", "pointer": "/pools/0/members/0/worker"}]
    await api.ok("POST", "/v1/rules", json={"rules": [{"id": "r", "pool": "desk"}]})
    body = assert_error(await api.call("DELETE", "/v1/pools/desk"), 409, "routing.in_use")
    assert body["details"] == {
        "pool": "desk",
        "used_by": [{"rule": "r", "pointer": "/rule_set/rules/0/pool"}],
    }
    assert (await api.ok("GET", "/v1/rules"))["version"] == 2
    await api.ok("POST", "/v1/rules", json={"rules": []})
    assert [p["id"] for p in await api.ok("GET", "/v1/pools")] == ["desk"]
    assert (await api.ok("GET", "/v1/rules"))["version"] == 3
    assert len(await api.ok("GET", "/v1/workers")) == 2
    # Malformed bodies and unknown fields.
    assert_error(await api.call("POST", "/v1/workers", content=b"{"), 400, "request.malformed_json")
    assert_error(
        await api.call("POST", "/v1/workers", json={"id": "z", "colour": "red"}),
        422,
        "request.invalid",
    )
    assert_error(await api.call("POST", "/v1/route", json={"kind": "lead"}), 422, "request.invalid")


async def test_invalid_routable_is_422_with_every_problem_and_stores_nothing(api: Api) -> None:
    await setup_desk(api)
    body = assert_error(
        await api.call("POST", "/v1/route", json={"id": "q", "kind": "lead", "attributes": {}}),
        422,
        "routing.routable_invalid",
    )
    assert body["details"][0]["pointer"] == "/attributes/state"
    assert_error(
        await api.call("POST", "/v1/route", json={"id": "q", "kind": "nope"}),
        422,
        "routing.routable_invalid",
    )
    negative = assert_error(
        await api.call(
            "POST",
            "/v1/route",
            json={"id": "q", "kind": "lead", "attributes": {"state": "CA"}, "price": -5},
        ),
        422,
        "routing.routable_invalid",
    )
    assert negative["details"] == [{"pointer": "/price", "message": "price must be >= 0"}]
    assert_error(
        await api.call(
            "POST",
            "/v1/route",
            json={"id": "q", "kind": "lead", "attributes": {"state": "CA"}, "pool": "zz"},
        ),
        404,
        "pool.not_found",
    )


async def test_idempotency_key_replays_the_first_decision(api: Api) -> None:
    await setup_desk(api, cap=1)
    lead = {"id": "l", "kind": "lead", "attributes": {"state": "CA"}}
    headers = {"Idempotency-Key": "lead-l"}
    first = await api.call("POST", "/v1/route", json=lead, headers=headers)
    again = await api.call("POST", "/v1/route", json=lead, headers=headers)
    assert first.status_code == again.status_code == 201
    assert again.headers.get("Idempotency-Replayed") == "true"
    assert again.json() == first.json()
    # Only one cap slot was used: one more lead still finds a worker.
    other = await api.ok("POST", "/v1/route", json={**lead, "id": "m"})
    assert other["worker"] not in (None, first.json()["worker"])
    changed = await api.call("POST", "/v1/route", json={**lead, "id": "zz"}, headers=headers)
    assert_error(changed, 422, "idempotency.conflict")
    # Idempotent configuration and assignment calls too.
    w1 = await api.call("POST", "/v1/workers", json={"id": "dee"}, headers={"Idempotency-Key": "w"})
    w2 = await api.call("POST", "/v1/workers", json={"id": "dee"}, headers={"Idempotency-Key": "w"})
    assert (w1.status_code, w2.status_code) == (201, 201)
    aid = first.json()["assignment_id"]
    c1 = await api.call("POST", f"/v1/assignments/{aid}/complete", headers={"Idempotency-Key": "c"})
    c2 = await api.call("POST", f"/v1/assignments/{aid}/complete", headers={"Idempotency-Key": "c"})
    assert (c1.status_code, c2.status_code) == (200, 200)
    assert c2.json()["status"] == "completed"


async def test_another_tenants_routing_objects_are_not_found(api: Api) -> None:
    await setup_desk(api)
    d = await api.ok(
        "POST", "/v1/route", json={"id": "l", "kind": "lead", "attributes": {"state": "CA"}}
    )
    for method, path, code in [
        ("GET", f"/v1/decisions/{d['id']}", "decision.not_found"),
        ("GET", f"/v1/assignments/{d['assignment_id']}", "assignment.not_found"),
        ("POST", f"/v1/assignments/{d['assignment_id']}/complete", "assignment.not_found"),
        ("GET", "/v1/workers/ana", "worker.not_found"),
        ("GET", "/v1/pools/desk", "pool.not_found"),
        ("GET", "/v1/pools/desk/shadow-report", "pool.not_found"),
        ("DELETE", "/v1/pools/desk", "pool.not_found"),
        ("GET", "/v1/rules", "rule_set.not_found"),
    ]:
        assert_error(await api.call(method, path, as_b=True), 404, code)
    assert await api.ok("GET", "/v1/workers", as_b=True) == []
    # Tenant b has no kinds: its routable is invalid, and a's state is untouched.
    assert_error(
        await api.call("POST", "/v1/route", json={"id": "l", "kind": "lead"}, as_b=True),
        422,
        "routing.routable_invalid",
    )
    assert (await api.ok("GET", f"/v1/assignments/{d['assignment_id']}"))["status"] == "assigned"


async def test_shadow_report_counts_agreement(api: Api) -> None:
    await setup_desk(api, cap=10)
    for i in range(6):
        await api.ok(
            "POST", "/v1/route", json={"id": f"s{i}", "kind": "lead", "attributes": {"state": "CA"}}
        )
    report = await api.ok("GET", "/v1/pools/desk/shadow-report")
    assert report["pool"] == "desk"
    assert report["decisions"] == 6
    (row,) = report["strategies"]
    assert row["strategy"] == "least_loaded"
    assert row["live_strategy"] == "round_robin"
    assert row["decisions"] == 6
    assert sum(row["live_distribution"].values()) == 6
    assert 0 <= row["agreements"] <= 6


async def test_openapi_documents_routing_bodies_and_answers(api: Api) -> None:
    doc = (await api.client.get("/docs/openapi.json")).json()
    paths = doc["paths"]
    route = paths["/v1/route"]["post"]
    body_ref = route["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body_ref.endswith("/RouteBody")
    answer = route["responses"]["201"]["content"]["application/json"]["schema"]["$ref"]
    assert answer.endswith("/DecisionView")
    assert "explanation" in doc["components"]["schemas"]["DecisionView"]["properties"]
    assert "401" in paths["/v1/pools/{pool_id}/shadow-report"]["get"]["responses"]
    for path in ("/v1/workers", "/v1/pools", "/v1/rules", "/v1/assignments/{assignment_id}/reject"):
        assert "post" in paths[path], path


async def test_tenants_with_the_same_ids_have_their_own_caps(api: Api) -> None:
    await setup_desk(api, cap=1)
    # Tenant b builds the very same configuration: same worker and pool ids.
    for worker in ("ana", "ben"):
        await api.ok("POST", "/v1/workers", json={"id": worker}, as_b=True)
    await api.ok(
        "POST",
        "/v1/pools",
        json={
            "id": "desk",
            "members": [
                {"worker": "ana", "caps": [{"window": "day", "limit": 1}]},
                {"worker": "ben", "caps": [{"window": "day", "limit": 1}]},
            ],
        },
        as_b=True,
    )
    await api.ok(
        "POST", "/v1/rules", json={"kinds": {"lead": {}}, "default_pool": "desk"}, as_b=True
    )
    lead = {"kind": "lead", "attributes": {"state": "CA"}}
    a = [await api.ok("POST", "/v1/route", json={**lead, "id": f"a{i}"}) for i in range(3)]
    b = [
        await api.ok("POST", "/v1/route", json={**lead, "id": f"a{i}"}, as_b=True) for i in range(3)
    ]
    assert sorted(str(d["worker"]) for d in a) == ["None", "ana", "ben"]
    assert sorted(str(d["worker"]) for d in b) == ["None", "ana", "ben"]
    # b's rule set is its own version 1, and b sees none of a's decisions.
    assert b[0]["explanation"]["rule_set"] == "default"
    for d in a:
        assert (await api.call("GET", f"/v1/decisions/{d['id']}", as_b=True)).status_code == 404


async def test_a_worker_whose_id_holds_a_slash_is_read_and_deleted_with_it_encoded(
    api: Api,
) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "team/ana"})
    worker = await api.ok("GET", "/v1/workers/team%2Fana")
    assert worker["id"] == "team/ana"
    deleted = await api.call("DELETE", "/v1/workers/team%2Fana")
    assert deleted.status_code == 204, deleted.text
    gone = await api.call("GET", "/v1/workers/team%2Fana")
    assert gone.status_code == 404, gone.text
    assert gone.json()["code"] == "worker.not_found"


async def test_a_worker_id_ending_in_a_slash_is_its_own_worker(api: Api) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "ana/"})
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    assert (await api.ok("GET", "/v1/workers/ana%2F"))["id"] == "ana/"
    deleted = await api.call("DELETE", "/v1/workers/ana%2F")
    assert deleted.status_code == 204, deleted.text
    assert (await api.call("GET", "/v1/workers/ana%2F")).status_code == 404
    assert (await api.ok("GET", "/v1/workers/ana"))["id"] == "ana"


async def test_a_pool_id_with_a_slash_is_refused_where_its_urls_could_not_reach_it(
    api: Api,
) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    refused = await api.call("POST", "/v1/pools", json={"id": "east/1", "members": []})
    body = assert_error(refused, 422, "request.invalid")
    assert body["details"]["path"] == "$.id"
    assert "may not contain '/'" in body["message"]
    assert await api.ok("GET", "/v1/pools") == []
    checked = await api.ok(
        "POST", "/v1/routing/validate", json={"pools": [{"id": "east/1", "members": []}]}
    )
    assert checked["valid"] is False
    assert [p["pointer"] for p in checked["problems"]] == ["/pools/0/id"]


async def test_integers_past_two_to_the_53_in_the_configuration_still_route(api: Api) -> None:
    # A 64-bit id among a worker's attributes, and a seed as large: JSON readers keep
    # them as doubles, and the configuration's hash reads them so too.
    snowflake = 1_541_815_603_606_036_480
    await api.ok("POST", "/v1/workers", json={"id": "ana", "attributes": {"uid": snowflake}})
    await api.ok("POST", "/v1/pools", json={"id": "desk", "members": [{"worker": "ana"}]})
    await api.ok(
        "POST", "/v1/rules", json={"kinds": LEAD_KIND, "default_pool": "desk", "seed": 2**62}
    )
    decision = await api.ok(
        "POST", "/v1/route", json={"id": "l1", "kind": "lead", "attributes": {"state": "CA"}}
    )
    assert (decision["outcome"], decision["worker"]) == ("assigned", "ana")
    assert (await api.ok("GET", "/v1/workers/ana"))["attributes"] == {"uid": snowflake}


async def test_a_bid_budget_or_reserve_past_10_to_the_15_micros_is_refused(api: Api) -> None:
    # A routable's price is at most 10^15 micros; so is every amount a pool names.
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    body = assert_error(
        await api.call(
            "POST",
            "/v1/pools",
            json={
                "id": "desk",
                "strategy": {"name": "auction", "options": {"reserve": 10**15 + 1}},
                "members": [
                    {"worker": "ana", "bid": 2**62, "budget": {"limit": 2**63 - 1}},
                ],
            },
        ),
        422,
        "routing.config",
    )
    assert [p["pointer"] for p in body["details"]] == [
        "/members/0/bid",
        "/members/0/budget/limit",
        "/strategy",
    ]
    assert "10^15" in body["details"][0]["message"], body
    assert (await api.call("GET", "/v1/pools/desk")).status_code == 404
    pool = {
        "id": "desk",
        "strategy": {"name": "auction", "options": {"reserve": 10**15}},
        "members": [{"worker": "ana", "bid": 10**15, "budget": {"limit": 10**15}}],
    }
    await api.ok("POST", "/v1/pools", json=pool)


async def test_delete_ignores_the_idempotency_key_a_second_delete_is_404(api: Api) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    key = {"Idempotency-Key": "del-ana"}
    first = await api.call("DELETE", "/v1/workers/ana", headers=key)
    assert first.status_code == 204, first.text
    again = await api.call("DELETE", "/v1/workers/ana", headers=key)
    assert_error(again, 404, "worker.not_found")


async def test_an_in_filter_given_a_value_is_refused_at_its_pointer(api: Api) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    pool = {
        "id": "desk",
        "members": [
            {"worker": "ana", "filters": [{"attribute": "state", "op": "in", "value": "CA"}]}
        ],
    }
    body = assert_error(await api.call("POST", "/v1/pools", json=pool), 422, "routing.config")
    assert body["details"] == [
        {
            "pointer": "/members/0/filters/0/value",
            "message": "'in' takes a list in 'values', not a 'value'",
        }
    ]
    assert await api.ok("GET", "/v1/pools") == []


async def test_rule_ids_and_kind_names_are_bounded_like_every_id(api: Api) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "ana"})
    await api.ok("POST", "/v1/pools", json={"id": "desk", "members": [{"worker": "ana"}]})
    for body, path in [
        ({"rules": [{"id": "ok", "pool": "desk"}, {"id": "", "pool": "desk"}]}, "$.rules[1].id"),
        ({"rules": [{"id": "r\u0001", "pool": "desk"}]}, "$.rules[0].id"),
        ({"kinds": {"": {}}}, "$.kinds"),
        ({"kinds": {"k" * 257: {}}}, "$.kinds"),
    ]:
        refused = assert_error(
            await api.call("POST", "/v1/rules", json=body), 422, "request.invalid"
        )
        assert refused["details"]["path"] == path, refused
        checked = await api.ok("POST", "/v1/routing/validate", json={"rule_set": body})
        assert checked["valid"] is False, checked
    assert await api.ok("GET", "/v1/rules/versions") == []
