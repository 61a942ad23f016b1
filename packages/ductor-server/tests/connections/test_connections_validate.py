"""`POST /v1/connections/validate` on both backends: every problem a create would find,
with pointers, secrets never echoed, and nothing written."""

from __future__ import annotations

from .conftest import Api

TOKEN = "tok-3f9c1e77a2b84d05b6e1-secret-zq"


async def test_a_good_body_is_valid_and_nothing_is_created(api: Api) -> None:
    body = {"name": "crm", "provider": "echo", "config": {"region": "eu"}}
    assert await api.ok("POST", "/v1/connections/validate", json=body) == {
        "valid": True,
        "problems": [],
    }
    with_secret = {**body, "secrets": {"token": TOKEN}}
    assert (await api.ok("POST", "/v1/connections/validate", json=with_secret))["valid"]
    assert await api.ok("GET", "/v1/connections") == []


async def test_every_problem_with_its_pointer_and_no_secret_in_them(api: Api) -> None:
    body = {
        "name": "Bad Name",
        "provider": "echo",
        "description": "x" * 1001,
        "config": {"region": 7, "colour": "red"},
        "secrets": {"token": 5, "nope": TOKEN},
    }
    response = await api.call("POST", "/v1/connections/validate", json=body)
    assert response.status_code == 200, response.text
    assert TOKEN not in response.text
    report = response.json()
    assert report["valid"] is False
    pointers = [p["pointer"] for p in report["problems"]]
    assert pointers == [
        "/name",
        "/description",
        "/config/colour",
        "/config/region",
        "/secrets/nope",
        "/secrets/token",
    ]
    unknown = await api.ok(
        "POST", "/v1/connections/validate", json={"name": "ok", "provider": "ghost"}
    )
    assert [p["pointer"] for p in unknown["problems"]] == ["/provider"]


async def test_a_body_of_the_wrong_shape_is_a_400_with_its_path(api: Api) -> None:
    response = await api.call(
        "POST", "/v1/connections/validate", json={"name": ["x"], "provider": "echo"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "request.invalid"
    assert response.json()["details"]["path"] == "$.name"
