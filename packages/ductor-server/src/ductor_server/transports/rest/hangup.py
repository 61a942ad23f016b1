"""Ends the handler of a bodiless GET or HEAD whose client hangs up before the answer.

A long poll (`GET /v1/runs/{run_id}?wait=`) otherwise holds its waiter, one of
the tenant's limited slots, for a client that left, and is counted as answered
once its wait is out. A plain ASGI middleware inside the telemetry one, which
sees the `http.disconnect` pass and counts the request as 499. It never ends a
request with a body, nor one whose answer has begun (a stream listens for the
hang-up itself): only reads are cut short, and a read's transaction rolls back.
"""

from __future__ import annotations

import asyncio

from litestar.enums import ScopeType
from litestar.middleware import MiddlewareProtocol
from litestar.types import ASGIApp, Message, Receive, ReceiveMessage, Scope, Send

_READS = frozenset({"GET", "HEAD"})


def _bodiless(scope: Scope) -> bool:
    """No body follows the head: no `Content-Length` above 0, no `Transfer-Encoding`."""
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip() != b"0"):
            return False
    return True


class HangUpMiddleware(MiddlewareProtocol):
    """Cancel a bodiless GET or HEAD's handler when its client disconnects before
    the answer starts; the request then ends without one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != ScopeType.HTTP
            or scope.get("method") not in _READS
            or not _bodiless(scope)
        ):
            await self.app(scope, receive, send)
            return
        # The request's one (empty) body message, taken now so that the watch
        # below is the only reader until the handler asks for it.
        first = await receive()
        if first["type"] == "http.disconnect":
            return
        pending: list[ReceiveMessage] = [first]
        answering = ended = hung_up = False

        async def handler_receive() -> ReceiveMessage:
            return pending.pop() if pending else await receive()

        async def watched_send(message: Message) -> None:
            nonlocal answering
            if message["type"] == "http.response.start":
                answering = True
            await send(message)

        # The handler runs in this task, which a watch cancels on a hang-up: one
        # task more per read, not two.
        this = asyncio.current_task()
        assert this is not None

        async def watch() -> None:
            nonlocal hung_up
            # With the body read, the next message is http.disconnect: the client
            # left, or (on uvicorn) the answer is complete.
            await receive()
            if not answering and not ended:
                hung_up = True
                this.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await self.app(scope, handler_receive, watched_send)
        except asyncio.CancelledError:
            # Ours: end quietly, with no answer. Anyone else's: carry on cancelling.
            if not hung_up or this.uncancel() > 0:
                raise
        else:
            if hung_up:  # the handler swallowed our cancel: take it back
                this.uncancel()
        finally:
            ended = True
            watcher.cancel()


__all__ = ["HangUpMiddleware"]
