"""Workflow options are checked when the workflow is registered, not at sync."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from ductor import Client, Concurrency, Context, Rate, Trigger
from ductor.errors import DurationError
from ductor.protocol import ConcurrencyInfo, RateInfo, TriggerInfo


async def body(ctx: Context, value: Any) -> Any:
    return value


def register(**options: Any) -> Client:
    client = Client("shop", signing_key="k")
    client.workflow("wf", **options)(body)
    return client


def test_good_options_travel_in_their_wire_form() -> None:
    client = register(
        trigger=["order.created", Trigger(cron="0 * * * *")],
        retries=0,
        concurrency=Concurrency(limit=2, key="input.id", rate=Rate(limit=5, period="90s")),
        timeout=timedelta(hours=1),
        name="Charge",
    )
    (info,) = client.describe().workflows
    assert info.triggers == [TriggerInfo(event="order.created"), TriggerInfo(cron="0 * * * *")]
    assert info.concurrency == ConcurrencyInfo(
        limit=2, key="input.id", rate=RateInfo(limit=5, period="1m30s")
    )
    assert (info.retries, info.timeout, info.name) == (0, "1h", "Charge")
    assert register(concurrency=3).describe().workflows[0].concurrency == ConcurrencyInfo(limit=3)


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"retries": 1.5}, TypeError, "retries"),
        ({"retries": "3"}, TypeError, "retries"),
        ({"retries": True}, TypeError, "retries"),
        ({"retries": -1}, ValueError, "retries"),
        ({"concurrency": 1.5}, TypeError, "concurrency"),
        ({"concurrency": "3"}, TypeError, "concurrency"),
        ({"concurrency": True}, TypeError, "concurrency"),
        ({"concurrency": 0}, ValueError, "concurrency limit"),
        ({"trigger": 123}, TypeError, "trigger"),
        ({"trigger": ["a", 5]}, TypeError, "trigger"),
        ({"trigger": ""}, ValueError, "trigger"),
        ({"name": 5}, TypeError, "name"),
        ({"timeout": 0}, DurationError, "duration"),
        ({"timeout": "soon"}, DurationError, "duration"),
        ({"timeout": "0s"}, ValueError, "timeout"),
        ({"timeout": timedelta(0)}, ValueError, "timeout"),
        ({"on_cancel": "refund"}, TypeError, "on_cancel"),
    ],
)
def test_a_bad_option_is_refused_at_registration(
    options: dict[str, Any], error: type[Exception], names: str
) -> None:
    client = Client("shop", signing_key="k")
    with pytest.raises(error, match=names):
        client.workflow("wf", **options)(body)
    assert client.workflows == {}
    client.describe()  # the app's other workflows still describe


@pytest.mark.parametrize(
    ("make", "error", "names"),
    [
        (lambda: Rate(limit=1.5, period="1m"), TypeError, "rate limit"),
        (lambda: Rate(limit=2, period="1m", burst=1.5), TypeError, "rate burst"),
        (lambda: Rate(limit=1, period="0s"), ValueError, "rate period"),
        (lambda: Rate(limit=1, period=timedelta(0)), ValueError, "rate period"),
        (lambda: Rate(limit=1, period="later"), DurationError, "duration"),
        (lambda: Concurrency(limit=1.5), TypeError, "concurrency limit"),
        (lambda: Concurrency(limit=True), TypeError, "concurrency limit"),
        (lambda: Concurrency(limit=1, key=5), TypeError, "concurrency key"),
        (lambda: Concurrency(limit=1, rate={"limit": 1}), TypeError, "concurrency rate"),
        (lambda: Trigger(event=5), TypeError, "event"),
        (lambda: Trigger(event=""), ValueError, "event"),
        (lambda: Trigger(cron="* * * * *", match=5), TypeError, "match"),
    ],
)
def test_a_bad_option_value_is_refused_where_it_is_made(
    make: Any, error: type[Exception], names: str
) -> None:
    with pytest.raises(error, match=names):
        make()


@pytest.mark.parametrize("app_id", ["", "a:b"])
def test_an_app_id_that_cannot_make_a_slug_is_refused(app_id: str) -> None:
    with pytest.raises(ValueError, match="app_id"):
        Client(app_id, signing_key="k")
