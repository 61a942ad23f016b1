"""Typing expectations of the SDK's public API, checked by `mypy --strict`.

Not run, only type-checked by test_typing.py. Each `assert_type` pins what a
user's editor sees; each `type: ignore[code]` pins an error mypy must report
(strict mode flags an ignore that is not needed, so a lost error fails too).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, assert_type

import msgspec

import ductor
from ductor import Client, Context, Event, Signal, Workflow
from ductor.api import ApiClient, AsyncApiClient, EventAccepted, Run
from ductor.protocol import (
    ExecuteRequest,
    ExecuteResponse,
    Opcode,
    SeenNonces,
    SigningKeys,
    StepRunOp,
    Verified,
    verify_signed,
)

client = Client("shop", signing_key="k", fallback_signing_key="old")
legacy = Client("shop", signing_key="k", require_nonce=False, seen_nonces=SeenNonces(capacity=10))
assert_type(SigningKeys("k").request_header(b"{}", now=0), str)
assert_type(SigningKeys("k").check(b"{}", None, now=0, require_nonce=True), Verified)
assert_type(verify_signed(b"{}", None, keys=["k"], now=0).nonce, str | None)
SigningKeys("k").header(b"{}", now=0, nonce=1)  # type: ignore[arg-type]


class Order(msgspec.Struct, frozen=True):
    id: int
    total: int


async def charge(order: Order, *, currency: str = "usd") -> dict[str, int]:
    return {"charged": order.total}


def tax(total: int) -> float:
    return total * 0.1


@client.workflow("charge-order", trigger="order.created", retries=2, concurrency=5, timeout="1h")
async def charge_order(ctx: Context, order: Order) -> list[str]:
    charged = await ctx.step.run("charge", charge, order, currency="eur")
    assert_type(charged, dict[str, int])
    taxed = await ctx.step.run("tax", tax, order.total)
    assert_type(taxed, float)
    a, b = await asyncio.gather(ctx.step.run("a", tax, 1), ctx.step.run("b", charge, order))
    assert_type(a, float)
    assert_type(b, dict[str, int])
    assert_type(await ctx.step.sleep("nap", "10m"), None)
    await ctx.step.sleep("nap2", timedelta(minutes=1))
    await ctx.step.sleep_until("later", datetime(2030, 1, 1, tzinfo=UTC))
    got = await ctx.step.wait_for_event("shipped", event="order.shipped", timeout="7d")
    assert_type(got, Event | None)
    sig = await ctx.step.wait_for_signal("approve", timeout="1d")
    assert_type(sig, Signal | None)
    child = await ctx.step.invoke("receipt", workflow="send-receipt", input=charged)
    assert_type(child, Any)
    assert_type(ctx.run_id, str)
    assert_type(ctx.attempt, int)
    assert_type(ctx.event, Event | None)

    await ctx.step.run("bad-arg", tax, "not an int")  # type: ignore[call-overload]
    await ctx.step.run("bad-kw", charge, order, currency=3)  # type: ignore[arg-type]
    await ctx.step.run("missing", charge)  # type: ignore[call-overload]
    await ctx.step.sleep("bad", 5)  # type: ignore[arg-type]
    return []


assert_type(charge_order, Workflow[Order, list[str]])


@client.workflow("untyped")
async def untyped(ctx: Context, payload: dict[str, Any]) -> None:
    return None


assert_type(untyped, Workflow[dict[str, Any], None])


@client.workflow("not-async")  # type: ignore[arg-type]
def not_async(ctx: Context, payload: int) -> int:
    return payload


async def server_side() -> None:
    response = await client.execute(ExecuteRequest(run_id="r", workflow_id="charge-order"))
    assert_type(response, ExecuteResponse)
    first = response.opcodes[0]
    assert_type(first, Opcode)
    if isinstance(first, StepRunOp):
        assert_type(first.result, Any)
    inline = await client.run_inline(charge_order, Order(id=1, total=2))
    assert_type(inline, ductor.InlineRun)
    answer = await client.handle("POST", {}, b"{}")
    assert_type(answer.status, int)
    assert_type(answer.body, bytes)


def api_sync() -> None:
    with ApiClient("http://127.0.0.1:7070", api_key="key") as api:
        run = api.trigger("charge-order", {"id": 1}, idempotency_key="k")
        assert_type(run, Run)
        assert_type(api.wait_for_result(run.id, timeout=5), Run)
        assert_type(api.send_event("order.created", {"id": 1}), EventAccepted)
        assert_type(api.signal(run.id, "go"), None)
        api.trigger(family_slug=1)  # type: ignore[arg-type]


async def api_async() -> None:
    async with AsyncApiClient(api_key="key") as api:
        run = await api.get_run("run-1")
        assert_type(run, Run)
        assert_type(run.done, bool)


try:
    pass
except ductor.StepFailed as failed:
    assert_type(failed.step, str)
    assert_type(failed.code, str)
except ductor.ApiError as err:
    assert_type(err.status, int)
