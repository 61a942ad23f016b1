"""The inference proxy: OpenAI-compatible chat completions and embeddings forwarded to a
tenant's `openai` connection, each call recorded with its tokens, latency and cost.

One proxied request goes: check the body (model, messages or input) -> pick the
connection (the `Ductor-Connection` header, else the body's `ductor_connection`,
else the tenant's default) -> admit it in one transaction (count it on
`ai.requests` and refuse it with `budget.exceeded` when that, or its estimate on
`ai.tokens` / `ai.cost`, would pass a blocking budget; nothing is sent upstream
then) -> forward it through the outbound guard (the connection's guarded
client) -> record it and add its tokens and cost to the meters, which are never
refused afterwards (the work is done). A stream is passed on event by event as
the upstream sends it; the proxy asks the upstream for a final usage chunk and
withholds that chunk from a caller that did not ask for it. ACTION steps on an
`openai` connection are recorded and metered the same way (`record_action`).

Costs are integer micros: `ceil((tokens_in * input_per_million + tokens_out *
output_per_million) / 1_000_000)` from the tenant's price of the model (or of
`*`). No HTTP framework here; the transport turns `ProxyAnswer` into a response.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Final

import httpx
import msgspec

from ductor_core.runs import ErrorInfo
from ductor_core.validation import SLUG_PATTERN
from ductor_server.ai import (
    AiConnectionUnsupported,
    AiNoConnection,
    AiRequestNotFound,
    AiRequestRecord,
    AiTx,
    AiUpstreamError,
    AiUpstreamTimeout,
    PriceNotFound,
    PriceRecord,
)
from ductor_server.connections import ConnectionCalls, ConnectionNotFound, SecretKeys
from ductor_server.connections.calls import CompletedCall, Opened, load, open_record
from ductor_server.connections.store import ConnectionRecord, ConnectionsTx
from ductor_server.engine.clock import Clock, SystemClock
from ductor_server.engine.outbound import OutboundForbidden, read_capped
from ductor_server.errors import RequestInvalid, ServerError
from ductor_server.json_depth import MAX_DEPTH, nesting_depth
from ductor_server.metering.store import BudgetRecord, MeteringTx
from ductor_server.providers import ProviderRegistry, Redactor
from ductor_server.services.cursors import parse_time_cursor, time_cursor
from ductor_server.services.idempotency import Answer, Outcome
from ductor_server.services.metering import charge_usage
from ductor_server.storage.protocol import Store
from ductor_server.storage.usage import UsageIncrement, add_usage
from ductor_settlement import MAX_USAGE, BudgetExceeded, window_start

log = logging.getLogger("ductor_server.ai")

METER_REQUESTS: Final = "ai.requests"
METER_TOKENS: Final = "ai.tokens"
METER_COST: Final = "ai.cost"

DEFAULT_TIMEOUT = 60.0
"""Seconds the upstream may take (to answer, and between two chunks of a stream)."""

MAX_TIMEOUT = 600.0
"""The longest timeout a tenant may set."""

MAX_ANSWER_BYTES = 16 * 1024 * 1024
"""The most of a non-streamed upstream answer read (embeddings can be large)."""

MAX_EVENT_BYTES = 1024 * 1024
"""The longest one server-sent event of a stream may be."""

MAX_STREAM_BYTES = MAX_ANSWER_BYTES
"""The most of a streamed upstream answer relayed; past it the stream ends with an error."""

MAX_ERROR_BYTES = 8 * 1024
"""The longest error body of an upstream given back as its JSON object (in
`details.upstream_error`); a longer one is given as its first 500 bytes of text."""

MAX_PRICES = 1000
"""The most prices one tenant may set."""

MAX_PAGE = 500
"""The most records one page lists."""

PRICE_WILDCARD = "*"
"""The model whose price applies to models without one of their own."""

_SCALE = 1_000_000
_REQUEST_ID = re.compile(r"air_[0-9a-f]{32}")
_BODY_CONNECTION = "ductor_connection"


# --- bodies and views -----------------------------------------------------------------


class AiSettingsBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PUT /v1/ai/settings`.

    Attributes:
        default_connection: the `openai` connection used when a request names none.
        timeout_seconds: how long the upstream may take to answer, and between two
            chunks of a stream (0.1 to 600).
    """

    default_connection: Annotated[str, msgspec.Meta(min_length=1, max_length=64)] | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT


class AiSettingsView(msgspec.Struct, frozen=True, kw_only=True):
    """A tenant's proxy settings (`updated_at` null: never set, the defaults apply)."""

    default_connection: str | None
    timeout_seconds: float
    updated_at: datetime | None = None


class PriceBody(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`PUT /v1/ai/prices/{model}`: micros per million tokens.

    Attributes:
        input_per_million: the price of a million prompt tokens, in micros.
        output_per_million: the price of a million completion tokens, in micros.
    """

    input_per_million: int
    output_per_million: int = 0


class PriceView(msgspec.Struct, frozen=True, kw_only=True):
    """A model's price for the tenant."""

    model: str
    input_per_million: int
    output_per_million: int
    updated_at: datetime


class AiRequestView(msgspec.Struct, frozen=True, kw_only=True):
    """One model call (see docs/ai.md for every field)."""

    id: str
    source: str
    kind: str
    connection: str
    model: str
    stream: bool
    status: str
    http_status: int
    upstream_status: int | None
    error_code: str | None
    tokens_in: int
    tokens_out: int
    usage_source: str
    latency_ms: float
    cost_micros: int
    priced: bool
    run_id: str | None
    step_ref: str | None
    created_at: datetime


class AiRequestPage(msgspec.Struct, frozen=True, kw_only=True):
    """Model calls newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[AiRequestView]
    next_cursor: str | None = None


@dataclass(frozen=True, slots=True)
class ProxyAnswer:
    """What the transport sends: a whole JSON body, or a stream of SSE bytes.

    Attributes:
        headers: `Ductor-Request-Id`, and `Ductor-Cost-Micros` when known.
        content: the upstream's JSON answer, as it sent it (whole answers).
        stream: the events, as the upstream sends them (streams).
    """

    headers: dict[str, str]
    content: bytes | None = None
    stream: AsyncIterator[bytes] | None = None


# --- pure helpers ---------------------------------------------------------------------


def cost_micros(price: PriceRecord | None, tokens_in: int, tokens_out: int) -> int:
    """The cost of a call in micros, rounded up (0 without a price; at most 2**53 - 1)."""
    if price is None:
        return 0
    total = tokens_in * price.input_per_million + tokens_out * price.output_per_million
    return min(-(-total // _SCALE), MAX_USAGE)


def new_request_id() -> str:
    """A new model call record's id."""
    return f"air_{uuid.uuid4().hex}"


def estimate_tokens(text_chars: int) -> int:
    """A rough token count of `text_chars` characters (four per token, at least one)."""
    return max(1, -(-text_chars // 4))


def _text_chars(value: Any) -> int:
    """Characters of text in a message content, an embeddings input or a delta."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        total = 0
        for item in value:
            if isinstance(item, int) and not isinstance(item, bool):
                total += 4  # a token id
            elif isinstance(item, Mapping):
                total += _text_chars(item.get("text"))
            else:
                total += _text_chars(item)
        return total
    return 0


def _decode_json(content: bytes | str) -> Any:
    """The JSON value of an upstream's `content`, or None when it is not JSON or nests
    too deep for the decoder (a hostile upstream must not crash the request)."""
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return None


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(value: Any) -> Any:
    """`value`, a JSON value an upstream sent, with every lone surrogate (a `\\ud800`
    escape without its pair, which no UTF-8 text can hold, so no answer or store can)
    in its strings and keys replaced by U+FFFD; lists and objects are changed in place.
    Iterative: as deep as the decoder went."""
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for index, inner in enumerate(item):
                if isinstance(inner, str):
                    item[index] = _LONE_SURROGATE.sub("\ufffd", inner)
                elif isinstance(inner, list | dict):
                    stack.append(inner)
        elif isinstance(item, dict):
            entries = list(item.items())
            item.clear()
            for key, inner in entries:
                if isinstance(inner, str):
                    inner = _LONE_SURROGATE.sub("\ufffd", inner)
                elif isinstance(inner, list | dict):
                    stack.append(inner)
                item[_LONE_SURROGATE.sub("\ufffd", key)] = inner
    return value


def without_secrets(content: bytes, redactor: Redactor) -> bytes:
    """`content`, an upstream's JSON answer or one of its stream's events, as it came,
    unless it holds one of the connection's secrets (an upstream echoing the key it
    was sent): then with each masked, its JSON value encoded again (its `data:`
    lines', for an event), or as text where that value nests deeper than a request
    body may (a walk of it could exhaust the stack)."""
    text = content.decode(errors="replace")
    if redactor.text(text) == text:
        return content
    if content.lstrip().startswith(b"{") and nesting_depth(content) <= MAX_DEPTH:
        value = _decode_json(content)
        if value is not None:
            return json.dumps(redactor.value(value)).encode()
    lines = text.split("\n")
    for n, line in enumerate(lines):
        data = line[len("data:") :].strip() if line.startswith("data:") else ""
        if data.startswith("{") and nesting_depth(data.encode()) <= MAX_DEPTH:
            value = _decode_json(data)
            if value is not None:
                lines[n] = "data: " + json.dumps(redactor.value(value))
                continue
        lines[n] = redactor.text(line)
    return "\n".join(lines).encode()


def _problem(pointer: str, message: str) -> dict[str, str]:
    return {"pointer": pointer, "message": message}


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_USAGE:
        return value
    return None


def usage_counts(kind: str, usage: Any) -> tuple[int, int] | None:
    """The (prompt, completion) tokens of an upstream's `usage`, or None when it is not
    believable: each a count from 0 to 2^53 - 1 (a negative, fractional, textual or
    larger one makes the call estimated, not charged as claimed). Embeddings have no
    completion tokens, so theirs may be left out (0)."""
    if not isinstance(usage, dict):
        return None
    tokens_in = _int_or_none(usage.get("prompt_tokens"))
    out = usage.get("completion_tokens")
    tokens_out = 0 if kind == "embeddings" and out is None else _int_or_none(out)
    if tokens_in is None or tokens_out is None:
        return None
    return tokens_in, tokens_out


def _choices(value: Any) -> list[dict[str, Any]]:
    """The choices of an answer or a chunk that are objects (an upstream may send any
    JSON value there: the answer is still passed on, its text just not counted)."""
    return [c for c in value if isinstance(c, dict)] if isinstance(value, list) else []


def _bad_model(model: str) -> bool:
    """A model name no upstream is sent: blank, over 256 characters, or holding a
    control character (C0 or DEL)."""
    if not model.strip() or len(model) > 256:
        return True
    return any(ord(c) < 32 or ord(c) == 127 for c in model)


@dataclass(slots=True)
class _Call:
    """One proxied request, from its check to its record."""

    tenant_id: str
    id: str
    source: str
    kind: str
    model: str
    stream: bool
    body: dict[str, Any]
    estimate_in: int
    estimate_out: int
    started: float
    created_at: datetime
    connection: str = ""
    price: PriceRecord | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    out_chars: int = 0
    status: str = "ok"
    http_status: int = 200
    upstream_status: int | None = None
    error_code: str | None = None
    recorded: bool = False
    counted: bool = False
    ended: bool = False  # the stream's `[DONE]` was read
    delivered: bool = False  # ... and passed on: a hang-up after it is no failure
    notes: dict[str, Any] = field(default_factory=dict)


def check_body(kind: str, body: Any) -> tuple[str, bool, int, int]:
    """Check a chat or embeddings body: its model, stream flag and token estimates.

    Raises:
        RequestInvalid: every problem, each with a JSON pointer (`details.problems`).
    """
    if not isinstance(body, dict):
        raise RequestInvalid(
            "the body must be a JSON object", details={"problems": [_problem("", "not an object")]}
        )
    problems: list[dict[str, str]] = []
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        problems.append(_problem("/model", "required: the model's name (a non-empty string)"))
    elif _bad_model(model):
        problems.append(_problem("/model", "at most 256 characters, no control characters"))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        problems.append(_problem("/stream", "must be true or false"))
    connection = body.get(_BODY_CONNECTION)
    if connection is not None and (not isinstance(connection, str) or not connection):
        problems.append(_problem(f"/{_BODY_CONNECTION}", "must be a connection's name"))
    estimate_in = 0
    estimate_out = 0
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            problems.append(_problem("/messages", "required: a non-empty array of messages"))
        else:
            for i, message in enumerate(messages):
                if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                    problems.append(
                        _problem(f"/messages/{i}", "must be an object with a string role")
                    )
                else:
                    estimate_in += _text_chars(message.get("content"))
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if value is None:
                continue
            if _int_or_none(value) is None or value < 1:
                problems.append(_problem(f"/{name}", "must be a positive integer"))
            else:
                estimate_out = max(estimate_out, value)
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            problems.append(_problem("/stream_options", "must be an object"))
    else:
        value = body.get("input")
        if value is None or value == "" or value == []:
            problems.append(_problem("/input", "required: a string or an array to embed"))
        elif not isinstance(value, str | list):
            problems.append(_problem("/input", "must be a string or an array"))
        else:
            estimate_in = _text_chars(value)
        if stream:
            problems.append(_problem("/stream", "embeddings do not stream"))
    if problems:
        first = problems[0]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise RequestInvalid(
            f"{first['pointer']}: {first['message']}{more}", details={"problems": problems}
        )
    assert isinstance(model, str)
    return model, bool(stream), estimate_tokens(estimate_in), estimate_out


def _cursor(record: AiRequestRecord) -> str:
    return time_cursor(record.created_at, record.id)


def _parse_cursor(cursor: str) -> tuple[datetime, str]:
    parsed, request_id = parse_time_cursor(cursor)
    if not _REQUEST_ID.fullmatch(request_id):
        raise RequestInvalid("cursor is not one this API gave", details={"pointer": "cursor"})
    return parsed, request_id


def _view(record: AiRequestRecord) -> AiRequestView:
    return AiRequestView(
        id=record.id,
        source=record.source,
        kind=record.kind,
        connection=record.connection,
        model=record.model,
        stream=record.stream,
        status=record.status,
        http_status=record.http_status,
        upstream_status=record.upstream_status,
        error_code=record.error_code,
        tokens_in=record.tokens_in,
        tokens_out=record.tokens_out,
        usage_source=record.usage_source,
        latency_ms=record.latency_ms,
        cost_micros=record.cost_micros,
        priced=record.priced,
        run_id=record.run_id,
        step_ref=record.step_ref,
        created_at=record.created_at,
    )


def _check_model(model: str) -> None:
    if _bad_model(model):
        raise RequestInvalid(
            "a model name is 1-256 characters without control characters",
            details={"pointer": "model"},
        )


def _known_model(model: str) -> None:
    """Refuse a model name no price can have, before it reaches the store."""
    # Lenient: a price set when the rules allowed more can still be read and removed.
    if not model or len(model) > 256 or any(ord(c) < 32 for c in model):
        raise PriceNotFound(model[:256])


def _upstream_error(answer_status: int, content: bytes | None, opened: Opened) -> AiUpstreamError:
    error: Any = None
    message: str | None = None
    if content:
        # Given back in the error's details: no deeper than a request body may nest.
        decoded = None if nesting_depth(content) > MAX_DEPTH else _decode_json(content)
        decoded = without_lone_surrogates(decoded)
        if isinstance(decoded, dict):
            error = decoded.get("error", decoded)
        if error is None or len(content) > MAX_ERROR_BYTES:
            # Not JSON, or too long to give back (and store, with an agent's turn) whole.
            shown = content[:500].decode(errors="replace")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                message = error["message"]
            error = shown
    error = opened.redactor.value(error)
    said = f"the upstream answered {answer_status}"
    if message is not None:
        said += f": {opened.redactor.text(message)[:500]}"
    elif isinstance(error, dict) and isinstance(error.get("message"), str):
        said += f": {error['message'][:500]}"
    elif isinstance(error, str):
        said += f": {error[:200]}"
    return AiUpstreamError(
        said,
        {
            "upstream_status": answer_status,
            "upstream_error": error,
            "connection": opened.record.name,
        },
    )


# --- the service ----------------------------------------------------------------------


class AiService:
    """The inference proxy of every tenant: settings, prices, the calls and their records.

    Args:
        store: the opened store.
        providers: the providers of this process (the connection must be `openai`).
        keys: the ring connection secrets are sealed with.
        calls: where the guarded HTTP client of a connection comes from.
        clock: where `now` comes from.
    """

    def __init__(
        self,
        store: Store,
        providers: ProviderRegistry,
        keys: SecretKeys | None,
        calls: ConnectionCalls,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._store = store
        self._providers = providers
        self._keys = keys
        self._calls = calls
        self._clock = clock or SystemClock()
        self._pending: set[asyncio.Task[None]] = set()

    # --- settings and prices ---------------------------------------------------------

    async def get_settings(self, tenant_id: str) -> AiSettingsView:
        """The tenant's proxy settings (the defaults when never set)."""
        async with self._store.transaction() as tx:
            record = await AiTx(tx).get_settings(tenant_id)
        if record is None:
            return AiSettingsView(default_connection=None, timeout_seconds=DEFAULT_TIMEOUT)
        return AiSettingsView(
            default_connection=record.default_connection,
            timeout_seconds=record.timeout_seconds,
            updated_at=record.updated_at,
        )

    async def put_settings(self, tenant_id: str, body: AiSettingsBody) -> AiSettingsView:
        """Replace the tenant's proxy settings.

        Raises:
            RequestInvalid: a timeout out of range.
            ConnectionNotFound: the default connection does not exist.
            AiConnectionUnsupported: it is not an `openai` connection.
        """
        if not 0.1 <= body.timeout_seconds <= MAX_TIMEOUT:
            raise RequestInvalid(
                f"timeout_seconds must be from 0.1 to {MAX_TIMEOUT:g}",
                details={"pointer": "/timeout_seconds"},
            )
        if body.default_connection is not None:
            await self._open(tenant_id, body.default_connection)
        now = self._clock.now()
        async with self._store.transaction() as tx:
            await AiTx(tx).put_settings(
                tenant_id, body.default_connection, body.timeout_seconds, now
            )
        return AiSettingsView(
            default_connection=body.default_connection,
            timeout_seconds=body.timeout_seconds,
            updated_at=now,
        )

    async def put_price(self, tenant_id: str, model: str, body: PriceBody) -> Answer[PriceView]:
        """Create (`CREATED`) or replace (`OK`) the tenant's price of `model`.

        Raises:
            RequestInvalid: a bad model name, a negative or too large price, too many prices.
        """
        _check_model(model)
        for name in ("input_per_million", "output_per_million"):
            value = getattr(body, name)
            if isinstance(value, bool) or not 0 <= value <= MAX_USAGE:
                raise RequestInvalid(
                    f"{name} must be an integer from 0 to {MAX_USAGE} (micros)",
                    details={"pointer": f"/{name}"},
                )
        now = self._clock.now()
        price = PriceRecord(
            model=model,
            input_per_million=body.input_per_million,
            output_per_million=body.output_per_million,
            updated_at=now,
        )
        async with self._store.transaction() as tx:
            store = AiTx(tx)
            await tx.session.advisory_lock(f"ai.prices:{tenant_id}")
            if (
                await store.get_price(tenant_id, model) is None
                and await store.count_prices(tenant_id) >= MAX_PRICES
            ):
                raise RequestInvalid(
                    f"a tenant may have at most {MAX_PRICES} prices",
                    details={"limit": MAX_PRICES},
                )
            created = await store.put_price(tenant_id, price)
        view = PriceView(
            model=model,
            input_per_million=price.input_per_million,
            output_per_million=price.output_per_million,
            updated_at=now,
        )
        return Answer(view, Outcome.CREATED if created else Outcome.OK)

    async def get_price(self, tenant_id: str, model: str) -> PriceView:
        """The tenant's price of `model`.

        Raises:
            PriceNotFound: `ai.price_not_found`.
        """
        _known_model(model)
        async with self._store.transaction() as tx:
            record = await AiTx(tx).get_price(tenant_id, model)
        if record is None:
            raise PriceNotFound(model)
        return PriceView(
            model=record.model,
            input_per_million=record.input_per_million,
            output_per_million=record.output_per_million,
            updated_at=record.updated_at,
        )

    async def list_prices(self, tenant_id: str) -> list[PriceView]:
        """Every price of the tenant, by model."""
        async with self._store.transaction() as tx:
            records = await AiTx(tx).list_prices(tenant_id)
        return [
            PriceView(
                model=r.model,
                input_per_million=r.input_per_million,
                output_per_million=r.output_per_million,
                updated_at=r.updated_at,
            )
            for r in records
        ]

    async def delete_price(self, tenant_id: str, model: str) -> None:
        """Remove the tenant's price of `model`.

        Raises:
            PriceNotFound: `ai.price_not_found`.
        """
        _known_model(model)
        async with self._store.transaction() as tx:
            if not await AiTx(tx).delete_price(tenant_id, model):
                raise PriceNotFound(model)

    # --- records ---------------------------------------------------------------------

    async def get_request(self, tenant_id: str, request_id: str) -> AiRequestView:
        """One recorded model call.

        Raises:
            AiRequestNotFound: `ai.request_not_found` (another tenant's too).
        """
        if not _REQUEST_ID.fullmatch(request_id):  # no such id can exist
            raise AiRequestNotFound(request_id[:64])
        async with self._store.transaction() as tx:
            record = await AiTx(tx).get_request(tenant_id, request_id)
        if record is None:
            raise AiRequestNotFound(request_id)
        return _view(record)

    async def list_requests(
        self, tenant_id: str, *, cursor: str | None = None, limit: int = 50
    ) -> AiRequestPage:
        """The tenant's model calls, newest first; an empty `cursor` is the first page.

        Raises:
            RequestInvalid: a cursor this API did not give, a limit out of 1..500.
        """
        if isinstance(limit, bool) or not 1 <= limit <= MAX_PAGE:
            raise RequestInvalid(
                f"limit must be from 1 to {MAX_PAGE}", details={"pointer": "limit"}
            )
        before = _parse_cursor(cursor) if cursor else None
        async with self._store.transaction() as tx:
            records = await AiTx(tx).list_requests(tenant_id, before=before, limit=limit + 1)
        more = len(records) > limit
        records = records[:limit]
        return AiRequestPage(
            items=[_view(r) for r in records],
            next_cursor=_cursor(records[-1]) if more and records else None,
        )

    # --- the proxy -------------------------------------------------------------------

    async def _open(self, tenant_id: str, name: str) -> Opened:
        if not SLUG_PATTERN.fullmatch(name):  # no such name can exist
            raise ConnectionNotFound(name[:64])
        opened = await load(self._store, self._providers, self._keys, tenant_id, name)
        if opened.record.provider != "openai":
            raise AiConnectionUnsupported(name, opened.record.provider)
        return opened

    async def check_connection(self, tenant_id: str, name: str | None) -> str:
        """The connection a request naming `name` (or none: the default) would go to.

        Raises:
            AiNoConnection, ConnectionNotFound, AiConnectionUnsupported: none usable.
        """
        if not name:
            settings = await self.get_settings(tenant_id)
            name = settings.default_connection
            if not name:
                raise AiNoConnection()
        await self._open(tenant_id, name)
        return name

    async def proxy(
        self,
        tenant_id: str,
        kind: str,
        body: Any,
        *,
        connection: str | None,
        source: str = "proxy",
        request_id: str | None = None,
    ) -> ProxyAnswer:
        """Forward one chat (`kind` "chat") or embeddings request to the tenant's upstream.

        Args:
            tenant_id: who asks.
            kind: `chat` or `embeddings`.
            body: the decoded JSON body (passed on as is, less `ductor_connection`).
            connection: the `Ductor-Connection` header, if any.
            source: who asks, as the record says: `proxy` (the /v1/ai endpoints) or
                `agent` (the chat agent's model calls).
            request_id: the record's id (`air_` and 32 hex digits; a new one if None),
                so a caller knows it even when the call fails.

        Raises:
            RequestInvalid: a bad body (every problem with a pointer).
            AiNoConnection, ConnectionNotFound, AiConnectionUnsupported: no usable upstream.
            BudgetExceeded: a blocking budget would be passed (nothing was sent).
            AiUpstreamError, AiUpstreamTimeout: the upstream failed before answering.
        """
        model, stream, estimate_in, estimate_out = check_body(kind, body)
        if request_id is None:
            request_id = new_request_id()
        elif not _REQUEST_ID.fullmatch(request_id):
            raise ValueError(f"not an AI request id: {request_id[:64]!r}")
        call = _Call(
            tenant_id=tenant_id,
            id=request_id,
            source=source,
            kind=kind,
            model=model,
            stream=stream,
            body=dict(body),
            estimate_in=estimate_in,
            estimate_out=estimate_out,
            started=time.perf_counter(),
            created_at=self._clock.now(),
        )
        name = connection or call.body.pop(_BODY_CONNECTION, None)
        call.body.pop(_BODY_CONNECTION, None)
        try:
            record, timeout = await self._admit(call, name)
        except BudgetExceeded as exc:
            call.status, call.http_status, call.error_code = "refused", 429, exc.code
            call.tokens_in = call.tokens_out = 0
            await self._finish(call, meter=False)
            raise
        opened = open_record(record, self._providers, self._keys)
        if stream:
            return await self._stream(call, opened, timeout)
        return await self._whole(call, opened, timeout)

    async def _admit(self, call: _Call, name: str | None) -> tuple[ConnectionRecord, float]:
        """In one transaction: the settings, the connection, the price, and the budgets,
        which refuse the request before anything is sent. The request is counted on
        `ai.requests` here when a blocking budget watches that meter (so concurrent
        requests cannot pass it), else with its record."""
        now = self._clock.now()
        tenant_id = call.tenant_id
        async with self._store.transaction() as tx:
            store = AiTx(tx)
            settings = await store.get_settings(tenant_id)
            timeout = settings.timeout_seconds if settings is not None else DEFAULT_TIMEOUT
            if not name:
                name = settings.default_connection if settings is not None else None
            if not name:
                raise AiNoConnection()
            if not SLUG_PATTERN.fullmatch(name):  # no such name can exist
                raise ConnectionNotFound(name[:64])
            record = await ConnectionsTx(tx).get(tenant_id, name)
            if record is None:
                raise ConnectionNotFound(name)
            if record.provider != "openai":
                raise AiConnectionUnsupported(name, record.provider)
            call.connection = name
            call.price = await store.get_price(tenant_id, call.model)
            if call.price is None:
                call.price = await store.get_price(tenant_id, PRICE_WILDCARD)
            metering = MeteringTx(tx)
            requests = await metering.get_budget(tenant_id, METER_REQUESTS)
            if requests is not None and requests.policy.block:
                await charge_usage(tx, tenant_id, METER_REQUESTS, 1, now)
                call.counted = True
            tokens = call.estimate_in + call.estimate_out
            cost = cost_micros(call.price, call.estimate_in, call.estimate_out)
            for meter, amount in ((METER_TOKENS, tokens), (METER_COST, cost)):
                budget = await metering.get_budget(tenant_id, meter)
                if budget is not None:
                    await _refuse_estimate(metering, budget, amount, now)
        return record, timeout

    def _headers(self, opened: Opened) -> dict[str, str]:
        settings = opened.settings
        headers = {
            "Authorization": f"Bearer {opened.secrets.api_key}",
            "Content-Type": "application/json",
        }
        if settings.organization is not None:
            headers["OpenAI-Organization"] = settings.organization
        return headers

    def _url(self, call: _Call, opened: Opened) -> str:
        path = "chat/completions" if call.kind == "chat" else "embeddings"
        return f"{opened.settings.base_url.rstrip('/')}/{path}"

    async def _failed(self, call: _Call, error: ServerError) -> ServerError:
        call.status = {
            "ai.upstream_timeout": "upstream_timeout",
            "ai.upstream_error": "upstream_error",
        }.get(error.code, "failed")
        call.http_status = {"ai.upstream_timeout": 504, "ai.upstream_error": 502}.get(
            error.code, 422
        )
        call.error_code = error.code
        await self._finish(call)
        # The answer names the record it kept, as a success's Ductor-Request-Id does.
        if error.details is None or isinstance(error.details, dict):
            error.details = {**(error.details or {}), "request_id": call.id}
        return error

    def _transport_error(self, exc: BaseException, call: _Call, timeout: float) -> ServerError:
        where = {"connection": call.connection}
        if isinstance(exc, OutboundForbidden):
            return ServerError(str(exc), code="outbound.forbidden", details={"host": exc.host})
        if isinstance(exc, TimeoutError | httpx.TimeoutException):
            return AiUpstreamTimeout(timeout, where)
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return AiUpstreamError(
            f"the upstream could not be reached: {reason}", {"upstream_status": None, **where}
        )

    async def _whole(self, call: _Call, opened: Opened, limit: float) -> ProxyAnswer:
        context = self._calls.context(opened, idempotency_key=call.id, timeout=limit)
        content: bytes | None = None
        try:
            async with (
                asyncio.timeout(limit),
                context.http.stream(
                    "POST",
                    self._url(call, opened),
                    headers=self._headers(opened),
                    content=msgspec.json.encode(call.body),
                    timeout=limit,
                ) as response,
            ):
                call.upstream_status = response.status_code
                content = await read_capped(response, MAX_ANSWER_BYTES)
        except (OutboundForbidden, TimeoutError, httpx.HTTPError) as exc:
            error = self._transport_error(exc, call, limit)
            raise await self._failed(call, error) from None
        status = call.upstream_status or 0
        if content is None:
            error = AiUpstreamError(
                f"the upstream answered more than {MAX_ANSWER_BYTES} bytes",
                {"upstream_status": status, "connection": call.connection},
            )
            raise await self._failed(call, error)
        if not 200 <= status < 300:
            raise await self._failed(call, _upstream_error(status, content, opened))
        answer = _decode_json(content)
        if not isinstance(answer, dict):
            error = AiUpstreamError(
                "the upstream answered something other than a JSON object "
                "(or one nested too deep to read)",
                {"upstream_status": status, "connection": call.connection},
            )
            raise await self._failed(call, error)
        counts = usage_counts(call.kind, answer.get("usage"))
        if counts is not None:
            call.tokens_in, call.tokens_out = counts
        else:
            for choice in _choices(answer.get("choices")):
                if isinstance(choice.get("message"), dict):
                    call.out_chars += _text_chars(choice["message"].get("content"))
        await self._finish(call)
        content = without_secrets(content, opened.redactor)
        return ProxyAnswer(headers=self._answer_headers(call), content=content)

    def _answer_headers(self, call: _Call) -> dict[str, str]:
        tokens_in, tokens_out, source = self._tokens(call)
        return {
            "Ductor-Request-Id": call.id,
            "Ductor-Cost-Micros": str(cost_micros(call.price, tokens_in, tokens_out)),
            "Ductor-Usage-Source": source,
        }

    async def _stream(self, call: _Call, opened: Opened, limit: float) -> ProxyAnswer:
        asked_usage = isinstance(call.body.get("stream_options"), dict) and bool(
            call.body["stream_options"].get("include_usage")
        )
        options = dict(call.body.get("stream_options") or {})
        options["include_usage"] = True
        call.body["stream_options"] = options
        context = self._calls.context(opened, idempotency_key=call.id, timeout=limit)
        stack = AsyncExitStack()
        try:
            async with asyncio.timeout(limit):
                response = await stack.enter_async_context(
                    context.http.stream(
                        "POST",
                        self._url(call, opened),
                        headers={**self._headers(opened), "Accept": "text/event-stream"},
                        content=msgspec.json.encode(call.body),
                        timeout=limit,
                    )
                )
                call.upstream_status = response.status_code
                if not 200 <= response.status_code < 300:
                    content = await read_capped(response, 64 * 1024)
                    await stack.aclose()
                    raise await self._failed(
                        call, _upstream_error(response.status_code, content, opened)
                    )
        except (OutboundForbidden, TimeoutError, httpx.HTTPError) as exc:
            await stack.aclose()
            error = self._transport_error(exc, call, limit)
            raise await self._failed(call, error) from None
        events = self._events(
            call, response, stack, limit, asked_usage=asked_usage, redactor=opened.redactor
        )
        return ProxyAnswer(headers={"Ductor-Request-Id": call.id}, stream=events)

    async def _events(
        self,
        call: _Call,
        response: httpx.Response,
        stack: AsyncExitStack,
        limit: float,
        *,
        asked_usage: bool,
        redactor: Redactor,
    ) -> AsyncIterator[bytes]:
        """The upstream's events as they arrive, the connection's secrets masked in
        each; an error event when it fails midway or sends more than
        `MAX_STREAM_BYTES` in all."""
        buffer = bytearray()
        scanned = 0  # where the search for the next event's end goes on from
        cr = False  # the last chunk ended with a CR (maybe the half of a CRLF)
        received = 0
        chunks = response.aiter_bytes()
        try:
            while True:
                try:
                    async with asyncio.timeout(limit):
                        chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                received += len(chunk)
                if received > MAX_STREAM_BYTES:
                    raise _StreamBroken(
                        "ai.upstream_error",
                        f"the upstream's stream passed {MAX_STREAM_BYTES} bytes; it was cut there",
                    )
                # A line ends with CRLF, LF or CR (the SSE rules): all become LF.
                if cr:
                    chunk = b"\r" + chunk
                cr = chunk.endswith(b"\r")
                if cr:
                    chunk = chunk[:-1]
                buffer += chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                out: list[bytes] = []
                start = 0
                while (end := buffer.find(b"\n\n", max(scanned - 1, start))) >= 0:
                    if end - start > MAX_EVENT_BYTES:
                        # Its end came in the read that took it past the limit.
                        raise _StreamBroken(
                            "ai.upstream_error", "an event of the stream is too long"
                        )
                    event = bytes(buffer[start : end + 2])
                    start = scanned = end + 2
                    if self._keep(call, event, asked_usage=asked_usage):
                        out.append(without_secrets(event, redactor))
                del buffer[:start]
                scanned = len(buffer)
                if len(buffer) > MAX_EVENT_BYTES:
                    raise _StreamBroken("ai.upstream_error", "an event of the stream is too long")
                if out:
                    yield b"".join(out)
                    call.delivered = call.ended
            tail = bytes(buffer) + (b"\n" if cr else b"")
            if tail.strip() and self._keep(call, tail + b"\n\n", asked_usage=asked_usage):
                yield without_secrets(tail + b"\n\n", redactor)
        except (_StreamBroken, TimeoutError, httpx.HTTPError) as exc:
            if isinstance(exc, _StreamBroken):
                code, message = exc.code, exc.message
            elif isinstance(exc, TimeoutError | httpx.TimeoutException):
                code, message = "ai.upstream_timeout", f"the upstream was silent for {limit:g}s"
            else:
                code, message = "ai.upstream_error", f"the upstream stream broke: {exc}"
            call.status = "upstream_timeout" if code == "ai.upstream_timeout" else "upstream_error"
            call.error_code = code
            error = {"error": {"code": code, "type": code, "message": message}}
            yield b"event: error\ndata: " + json.dumps(error).encode() + b"\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            if not call.delivered:
                call.status, call.error_code = "client_closed", "ai.client_closed"
            raise
        finally:
            await stack.aclose()
            task = asyncio.ensure_future(self._finish(call))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)
            await asyncio.shield(task)

    def _keep(self, call: _Call, event: bytes, *, asked_usage: bool) -> bool:
        """Read one event's usage and text; False for a usage chunk the caller did not want."""
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                call.ended = True
            if not data.startswith(b"{"):
                continue
            chunk = _decode_json(data)
            if not isinstance(chunk, dict):
                continue
            usage = chunk.get("usage")
            counts = usage_counts(call.kind, usage)
            if counts is not None:
                call.tokens_in, call.tokens_out = counts
            if usage is not None and not asked_usage and not chunk.get("choices"):
                return False  # the usage chunk the proxy asked for, believed or not
            for choice in _choices(chunk.get("choices")):
                if isinstance(choice.get("delta"), dict):
                    call.out_chars += _text_chars(choice["delta"].get("content"))
        return True

    def _tokens(self, call: _Call) -> tuple[int, int, str]:
        if call.tokens_in is not None and call.tokens_out is not None:
            return call.tokens_in, call.tokens_out, "upstream"
        out = estimate_tokens(call.out_chars) if call.out_chars else 0
        return call.estimate_in, out, "estimated"

    async def _finish(self, call: _Call, *, meter: bool = True) -> None:
        """Store the call's record and add what it used to the meters (never refused)."""
        if call.recorded:
            return
        call.recorded = True
        tokens_in, tokens_out, source = self._tokens(call)
        if call.status in ("upstream_error", "upstream_timeout", "failed") and (
            call.tokens_in is None
        ):
            # A failed call that reported no usage is not charged.
            tokens_in = tokens_out = 0
        cost = cost_micros(call.price, tokens_in, tokens_out)
        record = AiRequestRecord(
            tenant_id=call.tenant_id,
            id=call.id,
            source=call.source,
            kind=call.kind,
            connection=call.connection,
            model=call.model,
            stream=call.stream,
            status=call.status,
            http_status=call.http_status,
            upstream_status=call.upstream_status,
            error_code=call.error_code,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            usage_source=source,
            latency_ms=round((time.perf_counter() - call.started) * 1000, 3),
            cost_micros=cost,
            priced=call.price is not None,
            created_at=call.created_at,
        )
        try:
            await self._store_record(record, meter=meter, counted=call.counted)
        except Exception:
            log.exception("the record of AI request %s could not be stored", call.id)

    async def _store_record(self, record: AiRequestRecord, *, meter: bool, counted: bool) -> bool:
        async with self._store.transaction() as tx:
            inserted = await AiTx(tx).insert_request(record)
            if inserted and meter:
                await add_usage(
                    tx.session,
                    [
                        UsageIncrement(record.tenant_id, METER_REQUESTS, 0 if counted else 1),
                        UsageIncrement(record.tenant_id, METER_TOKENS, record.tokens_in),
                        UsageIncrement(record.tenant_id, METER_TOKENS, record.tokens_out),
                        UsageIncrement(record.tenant_id, METER_COST, record.cost_micros),
                    ],
                    self._clock.now(),
                )
        return inserted

    async def drain(self) -> None:
        """Wait for the records of streams still being written."""
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    # --- ACTION steps ----------------------------------------------------------------

    async def record_action(self, completed: CompletedCall) -> None:
        """Record and meter an ACTION `chat` on an `openai` connection (once per attempt
        key; counted on `ai.requests`, `ai.tokens` and `ai.cost`, never refused)."""
        if completed.provider != "openai" or completed.operation != "chat":
            return
        output = completed.output if isinstance(completed.output, dict) else {}
        usage = output.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        model = output.get("model") or getattr(completed.input, "model", None) or ""
        tokens_in = _int_or_none(usage.get("prompt_tokens")) or 0
        tokens_out = _int_or_none(usage.get("completion_tokens")) or 0
        error: ErrorInfo | None = completed.error
        async with self._store.transaction() as tx:
            store = AiTx(tx)
            price = await store.get_price(completed.tenant_id, model)
            if price is None:
                price = await store.get_price(completed.tenant_id, PRICE_WILDCARD)
        upstream_status = None
        if error is not None and isinstance(error.details, dict):
            status = error.details.get("status")
            upstream_status = status if isinstance(status, int) else None
        record = AiRequestRecord(
            tenant_id=completed.tenant_id,
            id=new_request_id(),
            source="action",
            source_key=completed.idempotency_key,
            kind="chat",
            connection=completed.connection,
            model=str(model)[:256],
            stream=False,
            status="ok" if error is None else "upstream_error",
            http_status=200 if error is None else 502,
            upstream_status=upstream_status if error is not None else 200,
            error_code=None if error is None else error.code,
            tokens_in=tokens_in,
            tokens_out=tokens_out,
            usage_source="upstream",
            latency_ms=completed.latency_ms,
            cost_micros=cost_micros(price, tokens_in, tokens_out),
            priced=price is not None,
            run_id=completed.run_id,
            step_ref=completed.step_ref,
            created_at=self._clock.now(),
        )
        async with self._store.transaction() as tx:
            inserted = await AiTx(tx).insert_request(record)
            if inserted:
                await add_usage(
                    tx.session,
                    [
                        UsageIncrement(record.tenant_id, METER_REQUESTS, 1),
                        UsageIncrement(record.tenant_id, METER_TOKENS, tokens_in + tokens_out),
                        UsageIncrement(record.tenant_id, METER_COST, record.cost_micros),
                    ],
                    self._clock.now(),
                )


class _StreamBroken(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


async def _refuse_estimate(
    metering: MeteringTx, budget: BudgetRecord, amount: int, now: datetime
) -> None:
    """Refuse a request whose estimate would take a meter past its blocking budget (the
    usage itself is added when the answer is in)."""
    policy = budget.policy
    if not policy.block:
        return
    start = window_start(policy.window, now)
    current = await metering.counter(policy.tenant_id, policy.meter, policy.window, start)
    if current + amount > policy.limit:
        raise BudgetExceeded(
            f"meter {policy.meter!r} is at {current} of its {policy.window.value} limit of "
            f"{policy.limit}; this request is estimated at {amount} more",
            details={
                "meter": policy.meter,
                "window": policy.window.value,
                "window_start": start,
                "limit": policy.limit,
                "current": current,
                "requested": amount,
            },
        )


__all__ = [
    "DEFAULT_TIMEOUT",
    "METER_COST",
    "METER_REQUESTS",
    "METER_TOKENS",
    "AiRequestPage",
    "AiRequestView",
    "AiService",
    "AiSettingsBody",
    "AiSettingsView",
    "PriceBody",
    "PriceView",
    "ProxyAnswer",
    "check_body",
    "cost_micros",
    "estimate_tokens",
    "new_request_id",
    "usage_counts",
    "without_lone_surrogates",
]
