"""`POST /v1/routing/validate` on both backends: workers, pools and a rule set checked as
their puts would check them, together with the stored configuration; every problem
with a pointer into the body; the caller's tenant only; nothing written."""

from __future__ import annotations

from .conftest import Api


async def test_the_body_is_checked_with_the_stored_configuration(api: Api) -> None:
    await api.ok("POST", "/v1/workers", json={"id": "ana", "capacity": {"leads": 5}})
    body = {
        "workers": [{"id": "ben"}],
        "pools": [{"id": "desk", "members": [{"worker": "ana"}, {"worker": "ben"}]}],
        "rule_set": {"id": "main", "default_pool": "desk"},
    }
    assert await api.ok("POST", "/v1/routing/validate", json=body) == {
        "valid": True,
        "problems": [],
    }
    # Nothing was written.
    assert [w["id"] for w in await api.ok("GET", "/v1/workers")] == ["ana"]
    assert await api.ok("GET", "/v1/pools") == []
    assert (await api.call("GET", "/v1/rules")).status_code == 404
    # Another tenant's workers are not there for it.
    other = await api.call("POST", "/v1/routing/validate", json=body, as_b=True)
    assert other.status_code == 200, other.text
    assert other.json()["problems"] == [
        {"pointer": "/pools/0/members/0/worker", "message": "unknown worker 'ana'"}
    ]


async def test_every_problem_of_every_object_with_a_pointer_into_the_body(api: Api) -> None:
    body = {
        "workers": [
            {"id": "ok"},
            {"id": "bad", "capacity": {"leads": "five"}},
            {"id": "x", "colour": "red"},
            {"id": ""},
        ],
        "pools": [
            {"id": "p1", "members": [{"worker": "ok"}, {"worker": "ghost"}, {"worker": "bad"}]},
            {"id": "p2", "strategy": {"name": "fastest"}},
        ],
        "rule_set": {"rules": [{"id": "r", "pool": "nowhere", "when": "attributes.x >"}]},
    }
    report = await api.ok("POST", "/v1/routing/validate", json=body)
    assert report["valid"] is False
    found = [(p["pointer"], p["message"].split(";")[0][:40]) for p in report["problems"]]
    assert found == [
        ("/workers/1/capacity", "Expected `int`, got `str`"),
        ("/workers/2/colour", "unknown field 'colour'"),
        ("/workers/3/id", "worker id must be a non-empty string"),
        ("/pools/0/members/1/worker", "unknown worker 'ghost'"),
        ("/pools/1/strategy", "unknown strategy 'fastest'"),
        ("/rule_set/rules/0/pool", "unknown pool 'nowhere'"),
        ("/rule_set/rules/0/when", found[6][1]),
    ]
    assert found[6][1].startswith("syntax error")
    assert await api.ok("GET", "/v1/workers") == []


async def test_bodies_of_the_wrong_shape_are_400(api: Api) -> None:
    for body in ({"workers": {"id": "a"}}, {"pools": [], "extra": 1}, [1, 2]):
        response = await api.call("POST", "/v1/routing/validate", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "request.invalid"
    response = await api.call("POST", "/v1/routing/validate", json={"workers": ["w"]})
    assert response.status_code == 200
    assert response.json()["problems"] == [
        {"pointer": "/workers/0", "message": "'/workers/0' must be an object"}
    ]


async def test_a_pool_named_twice_is_reported_where_each_problem_is(api: Api) -> None:
    body = {
        "pools": [
            {"id": "pB", "members": [{"worker": "nobody"}]},
            {"id": "pB", "members": []},
            {"id": "pz", "strategy": {"name": "nope"}},
            {"id": "pz"},
        ],
        "rule_set": {"default_pool": "pz"},
    }
    report = await api.ok("POST", "/v1/routing/validate", json=body)
    found = [(p["pointer"], p["message"]) for p in report["problems"]]
    assert found == [
        ("/pools/0/members/0/worker", "unknown worker 'nobody'"),
        ("/pools/1/id", "duplicate pool"),
        ("/pools/2/strategy", found[2][1]),
        ("/pools/3/id", "duplicate pool"),
    ]
    assert found[2][1].startswith("unknown strategy 'nope'")
