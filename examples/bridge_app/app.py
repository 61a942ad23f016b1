"""A real Litestar app hosting durable workflows through the Ductor bridge SDK.

Every step body appends a line to `BRIDGE_APP_LOG` ("start <step>" then
"done <step>"), so a test can count how often each body ran. Configured by
the environment: DUCTOR_URL, DUCTOR_API_KEY, DUCTOR_BRIDGE_SIGNING_KEY (the
app's own key from `POST /v1/bridge/apps/shop/keys`, or the server-wide key),
BRIDGE_APP_URL (where the server reaches this app), BRIDGE_APP_VARIANT,
BRIDGE_APP_CHECKPOINT=1 (run consecutive steps in one execute, checkpointing each).

Run: `python examples/bridge_app/app.py --port 8010`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from litestar import Litestar, get

from ductor import Client, Context, NonRetriableError
from ductor.litestar import bridge_handler

LOG = Path(os.environ.get("BRIDGE_APP_LOG", "bridge-app.log"))
VARIANT = os.environ.get("BRIDGE_APP_VARIANT", "1")

SERVER_URL = os.environ.get("DUCTOR_URL", "http://127.0.0.1:7070")

client = Client(
    "shop",
    signing_key=os.environ.get("DUCTOR_BRIDGE_SIGNING_KEY", "signkey-dev-0001"),
    server_url=SERVER_URL,
    api_key=os.environ.get("DUCTOR_API_KEY"),
    url=os.environ.get("BRIDGE_APP_URL"),
    checkpoint=os.environ.get("BRIDGE_APP_CHECKPOINT") == "1",
)


def note(line: str) -> None:
    """Append one line to the execution log (flushed at once: the app may be killed)."""
    with LOG.open("a", encoding="utf-8") as log:
        log.write(line + "\n")


def lines() -> list[str]:
    """The execution log so far."""
    return LOG.read_text(encoding="utf-8").splitlines() if LOG.exists() else []


async def charge(order: dict[str, Any]) -> dict[str, Any]:
    """Charge the order (a side effect that must happen once)."""
    note("start charge")
    note("done charge")
    return {"charge_id": f"ch_{order['id']}", "amount": order["total"]}


@client.workflow("send-receipt")
async def send_receipt(ctx: Context, charge: dict[str, Any]) -> dict[str, Any]:
    """The second workflow, invoked by `fulfil-order`."""

    def send() -> dict[str, Any]:
        note("start send")
        note("done send")
        return {"sent": True, "charge_id": charge["charge_id"]}

    return await ctx.step.run("send", send)


@client.workflow("fulfil-order", trigger="order.created", retries=2)
async def fulfil_order(ctx: Context, order: dict[str, Any]) -> dict[str, Any]:
    """Uses every primitive: run, parallel runs, sleep, event, signal, invoke."""
    charged = await ctx.step.run("charge", charge, order)
    await ctx.step.sleep("cool-off", "1s")
    shipped = await ctx.step.wait_for_event(
        "shipped", event="order.shipped", match="event.data.order_id == input.id", timeout="1h"
    )
    approval = await ctx.step.wait_for_signal("approval", signal="approve", timeout="1h")
    labels = await asyncio.gather(
        ctx.step.run("label-box", lambda: f"box-{order['id']}"),
        ctx.step.run("label-invoice", lambda: f"invoice-{order['id']}"),
    )
    receipt = await ctx.step.invoke(
        "receipt", workflow="send-receipt", app_id="shop", input=charged
    )
    return {
        "charge": charged,
        "carrier": shipped.data["carrier"] if shipped is not None else None,
        "approved_by": approval.data if approval is not None else None,
        "labels": list(labels),
        "receipt": receipt,
    }


def _slow_step(name: str, seconds: float) -> Any:
    async def body() -> str:
        note(f"start {name}")
        await asyncio.sleep(seconds)
        note(f"done {name}")
        return name

    return body


@client.workflow("many-steps")
async def many_steps(ctx: Context, count: int) -> list[str]:
    """`count` steps in a row, each taking a moment (the app is killed among them)."""
    return [await ctx.step.run(f"s{i}", _slow_step(f"s{i}", 0.3)) for i in range(count)]


@client.workflow("flaky", retries=3)
async def flaky(ctx: Context, _: None) -> str:
    """A step that fails twice, then succeeds."""

    def attempt() -> str:
        tries = sum(1 for line in lines() if line == "start flaky") + 1
        note("start flaky")
        if tries < 3:
            raise RuntimeError(f"try {tries} fails")
        note("done flaky")
        return f"ok after {tries} tries"

    return await ctx.step.run("flaky", attempt)


@client.workflow("declined")
async def declined(ctx: Context, _: None) -> None:
    """A step that fails for good."""

    def decline() -> None:
        note("start decline")
        raise NonRetriableError("card declined by the issuer", code="card.declined")

    await ctx.step.run("decline", decline)


@client.workflow("evolving")
async def evolving(ctx: Context, _: None) -> str:
    """Variant 2 renames the first step: a run started on variant 1 must fail clearly."""
    first = "prepare" if VARIANT == "1" else "prepare-v2"
    await ctx.step.run(first, lambda: "prepared")
    await ctx.step.sleep("pause", "2s")
    return "evolved"


@client.workflow("quick")
async def quick(ctx: Context, name: str) -> str:
    """Two plain steps: handy for inline runs."""
    hello = await ctx.step.run("hello", lambda: f"hello {name}")
    return await ctx.step.run("shout", lambda: hello.upper())


@get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    """Liveness of the app itself."""
    return {"status": "ok"}


async def _register() -> None:
    if os.environ.get("DUCTOR_API_KEY"):
        await client.sync()


app = Litestar(
    route_handlers=[bridge_handler(client), healthz],
    on_startup=[_register],
    on_shutdown=[client.aclose],
)


def _server_unreachable() -> str | None:
    """Why the Ductor server cannot be reached at `SERVER_URL`; None when it answers."""
    try:
        httpx.get(f"{SERVER_URL}/healthz", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        return (
            f"error: no Ductor server answers at {SERVER_URL} ({exc}); "
            "start one, or point DUCTOR_URL at it"
        )
    return None


def main() -> None:
    """Serve the app on 127.0.0.1 (first checking the server it syncs with answers)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8010)
    args = parser.parse_args()
    if os.environ.get("DUCTOR_API_KEY") and (problem := _server_unreachable()):
        sys.exit(problem)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
