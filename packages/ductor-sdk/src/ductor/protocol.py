"""The bridge wire protocol: envelopes, opcodes, step ids and HMAC signing.

Shared by the SDK and the server (which imports it from here, so the two never
drift). Pure: depends on msgspec, hashlib, hmac and secrets only; no I/O, no
clock reads (callers pass `now`); `new_nonce` is the one function that reads
the OS random source. The golden vectors in `tests/contract/vectors/` pin it.

Wire rules:
- Bodies are compact JSON, UTF-8, fields in the order declared here, the tag
  (`action` for requests, `op` for opcodes) first, every field present
  (absent values are `null`). Decoders reject unknown fields.
- Every request and response carries `Ductor-Signature`. The key is the UTF-8
  bytes of the signing key string; signatures are lowercase hex HMAC-SHA256.
  - `v1=<hex>` signs `f"{t}." + body` (protocol 1).
  - `v2=<hex>` signs `f"{t}.{n}." + body`, where `n=<nonce>` is a request id:
    16 to 64 characters of `[0-9A-Za-z_-]`, fresh for every request (senders
    use `new_nonce()`: 32 hex digits, 128 random bits).
  A request is `t=<unix>,n=<nonce>,v1=<hex>..,v2=<hex>..` (one `v1` and one
  `v2` per signing key; the `v1`s let verifiers that predate `v2` read it).
  A response is `t=<unix>,v1=<hex>..`: it travels on the connection of the
  request it answers and is never accepted on its own.
- A verifier parses the header (at most `MAX_SIGNATURE_HEADER_LENGTH`
  characters; `t` once; `n` at most once; unknown schemes ignored, and `v2`s
  too when there is no `n`, as protocol 1 verifiers ignored them), refuses a
  `t` more than `REPLAY_WINDOW_SECONDS` from its clock (either side), then:
  with `n` and a `v2`, accepts if any `v2` matches under any of its keys (the
  `v1`s are not consulted) and reports the nonce; without them, refuses with
  `signature.nonce_required` if it requires nonces, else accepts if any `v1`
  matches (no nonce: such a message can be replayed within the window).
- A receiver that requires nonces accepts each nonce once: it remembers the
  nonces it accepted until `t + REPLAY_WINDOW_SECONDS` has passed and refuses a
  second use with `signature.replayed` (see `SeenNonces`).
- Step ids are `step_id(key)`: the first 32 hex digits of SHA-256 of the key,
  where the key is the step's name for its first use in a run and
  `f"{name}:{n}"` (n = 1, 2, ...) for repeats (see `StepKeys`).
"""

from __future__ import annotations

import enum
import functools
import hashlib
import heapq
import hmac
import secrets
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal, TypeAlias, TypeVar

import msgspec

from ductor.errors import ProtocolError, SignatureError

__all__ = [
    "APP_HEADER",
    "BRIDGE_PATH",
    "CHECKPOINT_PATH",
    "INLINE_LIMIT_BYTES",
    "INLINE_RUN_PATH",
    "MAX_SIGNATURE_HEADER_LENGTH",
    "PAYLOAD_PATH",
    "PROTOCOL_VERSION",
    "REPLAY_WINDOW_SECONDS",
    "SIGNATURE_HEADER",
    "SYNC_PATH",
    "UNREADABLE_JSON",
    "BridgeRequest",
    "CancelRequest",
    "CancelResponse",
    "CheckpointAck",
    "CheckpointRequest",
    "ConcurrencyInfo",
    "DescribeRequest",
    "DescribeResponse",
    "ErrorInfo",
    "ErrorResponse",
    "Event",
    "ExecutePayload",
    "ExecuteRequest",
    "ExecuteResponse",
    "HealthRequest",
    "HealthResponse",
    "InlineRunRequest",
    "InlineRunResponse",
    "InvokeOp",
    "Opcode",
    "OpcodeName",
    "RateInfo",
    "RunCompleteOp",
    "RunErrorOp",
    "RunFailedOp",
    "SeenNonces",
    "Signal",
    "SignatureParts",
    "SigningKeys",
    "SleepOp",
    "StepErrorOp",
    "StepFailedOp",
    "StepKeys",
    "StepPlannedOp",
    "StepRecord",
    "StepRunOp",
    "SyncAck",
    "SyncRequest",
    "SyncResponse",
    "TriggerInfo",
    "Verified",
    "WaitForEventOp",
    "WaitForSignalOp",
    "WorkflowInfo",
    "decode",
    "decode_request",
    "encode",
    "new_nonce",
    "parse_signature",
    "parse_signature_header",
    "sign",
    "sign_v2",
    "signature_header",
    "step_id",
    "step_record",
    "verify_signature",
    "verify_signed",
]

_T = TypeVar("_T")

PROTOCOL_VERSION: Final = "1"
"""Version of this wire protocol, sent in `health` and `describe`."""

SIGNATURE_HEADER: Final = "Ductor-Signature"
"""The one header that carries the timestamp and HMAC signatures."""

APP_HEADER: Final = "Ductor-App"
"""On a request to the server: the app whose keys the signature is checked with."""

REPLAY_WINDOW_SECONDS: Final = 300
"""A signed message older or newer than this (seconds) is rejected."""

INLINE_LIMIT_BYTES: Final = 1_048_576
"""Above this encoded size the engine sends `payload_ref` instead of input and steps."""

BRIDGE_PATH: Final = "/api/ductor"
"""Where adapters mount the app's bridge endpoint by default."""

SYNC_PATH: Final = "/v1/bridge/sync"
"""Server: POST a `DescribeResponse` to register or refresh an app -> `SyncAck`."""

INLINE_RUN_PATH: Final = "/v1/bridge/runs"
"""Server: POST an `InlineRunRequest` to start a run executed by the caller."""

CHECKPOINT_PATH: Final = "/v1/bridge/runs/{run_id}/checkpoint"
"""Server: POST a `CheckpointRequest` with opcodes produced in-process -> `CheckpointAck`."""

PAYLOAD_PATH: Final = "/v1/bridge/runs/{run_id}/payload"
"""Server: GET (query `ref`) the `ExecutePayload` an execute request referred to."""


class OpcodeName(enum.StrEnum):
    """Every opcode an execute response (or a checkpoint) can carry."""

    STEP_RUN = "STEP_RUN"
    STEP_ERROR = "STEP_ERROR"
    STEP_FAILED = "STEP_FAILED"
    STEP_PLANNED = "STEP_PLANNED"
    SLEEP = "SLEEP"
    WAIT_FOR_EVENT = "WAIT_FOR_EVENT"
    WAIT_FOR_SIGNAL = "WAIT_FOR_SIGNAL"
    INVOKE = "INVOKE"
    RUN_COMPLETE = "RUN_COMPLETE"
    RUN_ERROR = "RUN_ERROR"
    RUN_FAILED = "RUN_FAILED"


# ---------------------------------------------------------------- shared values


class _Wire(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every wire struct: frozen, keyword-only, strict on input."""


class ErrorInfo(_Wire, frozen=True, kw_only=True):
    """An error as it travels: stable `code`, human `message`, and whether to retry.

    `name` is the exception type's name where one raised it.
    """

    code: str
    message: str
    name: str | None = None
    retryable: bool = False
    details: Any = None


class Event(_Wire, frozen=True, kw_only=True):
    """An event: its `name`, `data`, optional `id` and ISO-8601 UTC `ts`."""

    name: str
    data: Any = None
    id: str | None = None
    ts: str | None = None


class Signal(_Wire, frozen=True, kw_only=True):
    """A signal sent to a run: its `name` and `data` (the request body)."""

    name: str
    data: Any = None


class StepRecord(_Wire, frozen=True, kw_only=True):
    """One recorded step of a run, in the order the engine recorded it.

    `op` is the opcode that produced it: `STEP_RUN` (with `result`),
    `STEP_FAILED` (with `error`), `SLEEP` (result null), `WAIT_FOR_EVENT`
    (result: the event, or null on timeout), `WAIT_FOR_SIGNAL` (result: the
    signal, or null on timeout) or `INVOKE` (result: the child's output, or
    `error` when the child failed).
    """

    id: str
    name: str
    op: OpcodeName
    result: Any = None
    error: ErrorInfo | None = None


# ---------------------------------------------------------------- requests to the app


class _Request(_Wire, frozen=True, kw_only=True, tag_field="action", forbid_unknown_fields=True):
    """Base of the five actions; the `action` field selects one."""


class HealthRequest(_Request, frozen=True, kw_only=True, tag="health"):
    """Liveness. Also served, unsigned, as a plain GET on the bridge path."""


class DescribeRequest(_Request, frozen=True, kw_only=True, tag="describe"):
    """Ask the app which workflows, triggers and options it serves."""


class SyncRequest(_Request, frozen=True, kw_only=True, tag="sync"):
    """Ask the app to POST its describe payload to the server's `SYNC_PATH`.

    `url` is the address the server reached the app at, used when the app was
    not configured with its own public URL.
    """

    url: str | None = None


class ExecuteRequest(_Request, frozen=True, kw_only=True, tag="execute"):
    """Advance a run: replay `steps` and report what happens next as opcodes.

    Attributes:
        run_id: the run.
        workflow_id: the workflow (as registered on the app's client).
        attempt: failed attempts so far of the step (or body) this request will
            run; 0 on the first try. The engine resets it after a step records.
        input: the run's input (null when `payload_ref` is set).
        steps: the recorded steps, in recorded order (empty when `payload_ref`).
        event: the event that triggered the run, if any.
        target_step: run exactly this planned step (after `STEP_PLANNED`).
        payload_ref: input, steps and event are too large to inline; fetch
            them from `PAYLOAD_PATH?ref=<payload_ref>`.
        traceparent: W3C trace context of the engine's span.
    """

    run_id: str
    workflow_id: str
    attempt: int = 0
    input: Any = None
    steps: list[StepRecord] = []
    event: Event | None = None
    target_step: str | None = None
    payload_ref: str | None = None
    traceparent: str | None = None


class CancelRequest(_Request, frozen=True, kw_only=True, tag="cancel"):
    """A run was cancelled: run the workflow's cancellation handler, if any."""

    run_id: str
    workflow_id: str
    input: Any = None
    reason: str | None = None


BridgeRequest: TypeAlias = (
    HealthRequest | DescribeRequest | SyncRequest | ExecuteRequest | CancelRequest
)
"""Any POST body the engine sends to the bridge endpoint."""


# ---------------------------------------------------------------- opcodes


class _Op(_Wire, frozen=True, kw_only=True, tag_field="op", forbid_unknown_fields=True):
    """Base of every opcode; the `op` field selects one."""


class StepRunOp(_Op, frozen=True, kw_only=True, tag="STEP_RUN"):
    """A step ran and succeeded: record `result` under `id`."""

    id: str
    name: str
    result: Any = None


class StepErrorOp(_Op, frozen=True, kw_only=True, tag="STEP_ERROR"):
    """A step raised a retriable error: retry it, not before `retry_after` if set."""

    id: str
    name: str
    error: ErrorInfo
    retry_after: str | None = None


class StepFailedOp(_Op, frozen=True, kw_only=True, tag="STEP_FAILED"):
    """A step failed for good: record `error` under `id` and call execute again."""

    id: str
    name: str
    error: ErrorInfo


class StepPlannedOp(_Op, frozen=True, kw_only=True, tag="STEP_PLANNED"):
    """A step was found but not run (parallel branch): run it with `target_step`."""

    id: str
    name: str


class SleepOp(_Op, frozen=True, kw_only=True, tag="SLEEP"):
    """Wait for a `duration` ("10m") or `until` an ISO-8601 UTC time; record null."""

    id: str
    name: str
    duration: str | None = None
    until: str | None = None


class WaitForEventOp(_Op, frozen=True, kw_only=True, tag="WAIT_FOR_EVENT"):
    """Wait for an event named `event` whose CEL `match` holds (over `event`, `input`).

    Record the event as the result, or null when `timeout` passes first.
    """

    id: str
    name: str
    event: str
    match: str | None = None
    timeout: str


class WaitForSignalOp(_Op, frozen=True, kw_only=True, tag="WAIT_FOR_SIGNAL"):
    """Wait for a signal named `signal` sent to this run; record it, or null on timeout."""

    id: str
    name: str
    signal: str
    timeout: str


class InvokeOp(_Op, frozen=True, kw_only=True, tag="INVOKE"):
    """Start a child run of `workflow` and record its output (or its error).

    `workflow` is a DAG family slug (pinned to `version` if set), or, with
    `app_id`, the id of a workflow that app serves (the calling app's own id
    for a workflow on the same client). The child fails if `timeout` passes.
    """

    id: str
    name: str
    workflow: str
    app_id: str | None = None
    input: Any = None
    version: int | None = None
    timeout: str | None = None


class RunCompleteOp(_Op, frozen=True, kw_only=True, tag="RUN_COMPLETE"):
    """The workflow returned: the run succeeded with `output`."""

    output: Any = None


class RunErrorOp(_Op, frozen=True, kw_only=True, tag="RUN_ERROR"):
    """The workflow body raised a retriable error: execute again later."""

    error: ErrorInfo
    retry_after: str | None = None


class RunFailedOp(_Op, frozen=True, kw_only=True, tag="RUN_FAILED"):
    """The workflow body failed for good (or its code changed): the run fails."""

    error: ErrorInfo


Opcode: TypeAlias = (
    StepRunOp
    | StepErrorOp
    | StepFailedOp
    | StepPlannedOp
    | SleepOp
    | WaitForEventOp
    | WaitForSignalOp
    | InvokeOp
    | RunCompleteOp
    | RunErrorOp
    | RunFailedOp
)
"""Any opcode."""


# ---------------------------------------------------------------- responses from the app


class HealthResponse(_Wire, frozen=True, kw_only=True):
    """The app is up: who it is and which protocol it speaks."""

    status: Literal["ok"] = "ok"
    app_id: str
    sdk: str
    sdk_version: str
    protocol: str = PROTOCOL_VERSION


class TriggerInfo(_Wire, frozen=True, kw_only=True):
    """What starts a workflow: an `event` name (with an optional CEL `match`) or a `cron`."""

    event: str | None = None
    cron: str | None = None
    match: str | None = None


class RateInfo(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    """At most `limit` step starts per `period` ("1m"), `burst` of them at once."""

    limit: int
    period: str
    burst: int = 1


class ConcurrencyInfo(_Wire, frozen=True, kw_only=True, omit_defaults=True):
    """At most `limit` steps running at once and at most `rate` step starts, per
    value of the CEL `key` (over `input`) when one is set; at least one of the two."""

    limit: int | None = None
    key: str | None = None
    rate: RateInfo | None = None


class WorkflowInfo(_Wire, frozen=True, kw_only=True):
    """One workflow the app serves, with its options."""

    id: str
    name: str | None = None
    triggers: list[TriggerInfo] = []
    retries: int
    concurrency: ConcurrencyInfo | None = None
    timeout: str | None = None
    cancellable: bool = False


class DescribeResponse(_Wire, frozen=True, kw_only=True):
    """The workflows, triggers and options this app serves; also the sync body."""

    app_id: str
    url: str | None = None
    sdk: str
    sdk_version: str
    protocol: str = PROTOCOL_VERSION
    workflows: list[WorkflowInfo] = []


class SyncResponse(_Wire, frozen=True, kw_only=True):
    """The answer to the `sync` action: the server's acknowledgement."""

    app_id: str
    synced: bool
    accepted: list[str] = []


class ExecuteResponse(_Wire, frozen=True, kw_only=True):
    """What happened in this execute: one or more opcodes (see docs/sdk.md)."""

    run_id: str
    opcodes: list[Opcode]


class CancelResponse(_Wire, frozen=True, kw_only=True):
    """Whether a cancellation handler ran, and its error if it raised."""

    run_id: str
    handled: bool
    error: ErrorInfo | None = None


class ErrorResponse(_Wire, frozen=True, kw_only=True):
    """The body of any non-2xx answer, on both sides of the bridge."""

    code: str
    message: str
    details: Any = None
    retryable: bool = False


# ---------------------------------------------------------------- the server's bridge endpoints


class SyncAck(_Wire, frozen=True, kw_only=True):
    """The server's answer to `POST SYNC_PATH`: the workflow ids it registered."""

    app_id: str
    accepted: list[str] = []


class InlineRunRequest(_Wire, frozen=True, kw_only=True):
    """`POST INLINE_RUN_PATH`: start a run the calling process executes itself."""

    app_id: str
    workflow_id: str
    input: Any = None


class InlineRunResponse(_Wire, frozen=True, kw_only=True):
    """The run the server created for an inline run."""

    run_id: str
    workflow_id: str


class CheckpointRequest(_Wire, frozen=True, kw_only=True):
    """`POST CHECKPOINT_PATH`: opcodes the app produced in-process, in order.

    The server records `STEP_RUN`/`STEP_FAILED` as history and treats any
    other opcode as if an execute response had returned it.
    """

    run_id: str
    app_id: str
    workflow_id: str
    opcodes: list[Opcode]


class CheckpointAck(_Wire, frozen=True, kw_only=True):
    """The server recorded the first `recorded` opcodes of a checkpoint."""

    run_id: str
    recorded: int


class ExecutePayload(_Wire, frozen=True, kw_only=True):
    """`GET PAYLOAD_PATH?ref=...`: the parts of an execute request not inlined."""

    run_id: str
    input: Any = None
    steps: list[StepRecord] = []
    event: Event | None = None


def step_record(
    op: StepRunOp | StepFailedOp | SleepOp | WaitForEventOp | WaitForSignalOp | InvokeOp,
    *,
    result: Any = None,
    error: ErrorInfo | None = None,
) -> StepRecord:
    """The history record the engine stores once a step opcode has resolved.

    `STEP_RUN` keeps its result and `STEP_FAILED` its error (both ignore the
    arguments). Give `result` for a resolved wait (the event or signal as
    JSON, or None on timeout) or a child's output, and `error` for a failed child.
    """
    if isinstance(op, StepRunOp):
        return StepRecord(id=op.id, name=op.name, op=OpcodeName.STEP_RUN, result=op.result)
    if isinstance(op, StepFailedOp):
        return StepRecord(id=op.id, name=op.name, op=OpcodeName.STEP_FAILED, error=op.error)
    if isinstance(op, SleepOp):
        return StepRecord(id=op.id, name=op.name, op=OpcodeName.SLEEP)
    if isinstance(op, WaitForEventOp):
        return StepRecord(id=op.id, name=op.name, op=OpcodeName.WAIT_FOR_EVENT, result=result)
    if isinstance(op, WaitForSignalOp):
        return StepRecord(id=op.id, name=op.name, op=OpcodeName.WAIT_FOR_SIGNAL, result=result)
    return StepRecord(id=op.id, name=op.name, op=OpcodeName.INVOKE, result=result, error=error)


# ---------------------------------------------------------------- encoding

_ENCODER = msgspec.json.Encoder()
_REQUEST_DECODER: msgspec.json.Decoder[BridgeRequest] = msgspec.json.Decoder(BridgeRequest)


UNREADABLE_JSON: Final = (msgspec.DecodeError, UnicodeDecodeError, RecursionError)
"""What msgspec raises for a body that is no JSON value of the type asked for: a
`DecodeError`, and also a `UnicodeDecodeError` for text that is not UTF-8 and a
`RecursionError` for values nested deeper than the interpreter's recursion limit."""


def encode(value: msgspec.Struct) -> bytes:
    """Encode a wire struct to its canonical JSON bytes. Text holding a lone
    surrogate (a step's name, say), which has no JSON form, is sent with U+FFFD in
    the surrogate's place, so every message still reads back."""
    try:
        return _ENCODER.encode(value)
    except UnicodeEncodeError:
        return _ENCODER.encode(_replace_surrogates(msgspec.to_builtins(value)))


def json_safe_text(text: str) -> str:
    """`text` with each lone surrogate, which no JSON reader takes, as U+FFFD."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _replace_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return json_safe_text(value)
    if isinstance(value, dict):
        return {_replace_surrogates(k): _replace_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_surrogates(item) for item in value]
    return value


def decode(body: bytes, type_: type[_T]) -> _T:
    """Decode a wire body as `type_` (e.g. `ExecuteResponse` on the engine's side).

    Raises:
        ProtocolError: the body does not decode as `type_`.
    """
    try:
        return msgspec.json.decode(body, type=type_)
    except UNREADABLE_JSON as exc:
        # A union such as `Opcode` has no __name__; name it by its text instead.
        name = getattr(type_, "__name__", None) or str(type_)
        raise ProtocolError(f"invalid {name}: {exc}") from None


def decode_request(body: bytes) -> BridgeRequest:
    """Decode a bridge POST body into one of the five actions.

    Raises:
        ProtocolError: the body is not a valid request envelope.
    """
    try:
        return _REQUEST_DECODER.decode(body)
    except UNREADABLE_JSON as exc:
        raise ProtocolError(f"invalid bridge request: {exc}") from None


# ---------------------------------------------------------------- step ids


@functools.lru_cache(maxsize=16_384)
def step_id(key: str) -> str:
    """The wire id of a step: the first 32 hex digits of SHA-256 of its key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


class StepKeys:
    """Numbers repeated step names within one run: `name`, `name:1`, `name:2`, ...

    A key already taken (even by a user name that happens to look like a
    repeat, such as "a:1") moves on to the next number, so keys never collide.
    """

    __slots__ = ("_next", "_used")

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._next: dict[str, int] = {}

    def key(self, name: str) -> str:
        """Return the next unused key for `name` and mark it used."""
        n = self._next.get(name, 0)
        key = name if n == 0 else f"{name}:{n}"
        while key in self._used:
            n += 1
            key = f"{name}:{n}"
        self._next[name] = n + 1
        self._used.add(key)
        return key


# ---------------------------------------------------------------- signing


def sign(body: bytes, key: str, timestamp: int) -> str:
    """The `v1` signature: HMAC-SHA256 of `f"{timestamp}."` + body under `key`, lowercase hex."""
    if not key:
        raise SignatureError("signing key must not be empty", code="signature.no_key")
    mac = hmac.new(key.encode("utf-8"), f"{timestamp}.".encode("ascii") + body, hashlib.sha256)
    return mac.hexdigest()


def sign_v2(body: bytes, key: str, timestamp: int, nonce: str) -> str:
    """The `v2` signature: HMAC-SHA256 of `f"{timestamp}.{nonce}."` + body, lowercase hex."""
    if not key:
        raise SignatureError("signing key must not be empty", code="signature.no_key")
    _check_nonce(nonce)
    message = f"{timestamp}.{nonce}.".encode("ascii") + body
    return hmac.new(key.encode("utf-8"), message, hashlib.sha256).hexdigest()


def new_nonce() -> str:
    """A fresh request id for `n=`: 32 hex digits from the OS random source."""
    return secrets.token_hex(16)


def signature_header(
    body: bytes, keys: Iterable[str], timestamp: int, *, nonce: str | None = None
) -> str:
    """The `Ductor-Signature` value: `t=<timestamp>` and one `v1=` per key, in order.

    With `nonce` (a request): `t=..,n=<nonce>`, then one `v1=` per key, then
    one `v2=` per key, in the keys' order.
    """
    keys = list(keys)
    parts = [f"t={timestamp}"]
    if nonce is not None:
        parts.append(f"n={nonce}")
    parts.extend(f"v1={sign(body, key, timestamp)}" for key in keys)
    if nonce is not None:
        parts.extend(f"v2={sign_v2(body, key, timestamp, nonce)}" for key in keys)
    return ",".join(parts)


MAX_SIGNATURE_HEADER_LENGTH: Final = 1024
"""The longest `Ductor-Signature` value accepted (a timestamp, a nonce and a few signatures)."""

_MAX_TIMESTAMP_DIGITS = 15
_SIGNATURE_HEX_LENGTH = 64
_HEX_DIGITS = frozenset("0123456789abcdef")
_NONCE_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_-")
_NONCE_MIN, _NONCE_MAX = 16, 64


def _malformed(reason: str) -> SignatureError:
    return SignatureError(
        f"malformed {SIGNATURE_HEADER} header: {reason}", code="signature.malformed"
    )


def _check_nonce(nonce: str) -> None:
    if not _NONCE_MIN <= len(nonce) <= _NONCE_MAX or not _NONCE_CHARS.issuperset(nonce):
        raise _malformed(f"n must be {_NONCE_MIN} to {_NONCE_MAX} characters of [0-9A-Za-z_-]")


def _hex_signature(scheme: str, value: str) -> str:
    signature = value.lower()
    # compare_digest refuses non-ASCII text, so the shape is checked first.
    if len(signature) != _SIGNATURE_HEX_LENGTH or not _HEX_DIGITS.issuperset(signature):
        raise _malformed(f"{scheme} must be {_SIGNATURE_HEX_LENGTH} hex digits")
    return signature


class SignatureParts(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed `Ductor-Signature`: the timestamp, the nonce if any, and the signatures.

    `v2` is empty when there is no nonce (a `v2` without `n` is ignored).
    """

    timestamp: int
    nonce: str | None
    v1: list[str]
    v2: list[str]


def parse_signature(header: str) -> SignatureParts:
    """Split a `Ductor-Signature` value into its parts (see the module docstring).

    The timestamp is 1 to 15 ASCII digits; a signature is 64 hex digits.
    Unknown schemes (`v0=`, `v3=`) are ignored so the header can grow, but the
    whole value is at most `MAX_SIGNATURE_HEADER_LENGTH` characters.

    Raises:
        SignatureError: an oversized header, no timestamp or a malformed one, a
            malformed nonce or signature, or no usable signature at all
            (`signature.malformed`).
    """
    if len(header) > MAX_SIGNATURE_HEADER_LENGTH:
        raise _malformed(f"longer than {MAX_SIGNATURE_HEADER_LENGTH} characters")
    timestamp: int | None = None
    nonce: str | None = None
    v1: list[str] = []
    v2_raw: list[str] = []
    for raw in header.split(","):
        name, sep, value = raw.strip().partition("=")
        if not sep:
            raise _malformed(f"{raw.strip()!r} is not key=value")
        if name == "t":
            # str.isdigit() accepts "²" and other digits int() refuses: check ASCII.
            if (
                timestamp is not None
                or not 0 < len(value) <= _MAX_TIMESTAMP_DIGITS
                or not (value.isascii() and value.isdigit())
            ):
                raise _malformed(f"bad timestamp {value!r} (1 to 15 digits)")
            timestamp = int(value)
        elif name == "n":
            if nonce is not None:
                raise _malformed("more than one n=<nonce>")
            _check_nonce(value)
            nonce = value
        elif name == "v1":
            v1.append(_hex_signature("v1", value))
        elif name == "v2":
            v2_raw.append(value)
    if timestamp is None:
        raise _malformed("no t=<unix seconds>")
    # Protocol 1 verifiers ignored v2; without a nonce it still means nothing.
    v2 = [_hex_signature("v2", value) for value in v2_raw] if nonce is not None else []
    if not v1 and not v2:
        raise _malformed("no v1=<hex> signature (nor n=<nonce> with v2=<hex>)")
    return SignatureParts(timestamp=timestamp, nonce=nonce, v1=v1, v2=v2)


def parse_signature_header(header: str) -> tuple[int, list[str]]:
    """The timestamp and the `v1` signatures of a `Ductor-Signature` (protocol 1 view).

    Raises:
        SignatureError: as `parse_signature`, and when there is no `v1`.
    """
    parts = parse_signature(header)
    if not parts.v1:
        raise _malformed("no v1=<hex> signature")
    return parts.timestamp, parts.v1


class Verified(msgspec.Struct, frozen=True, kw_only=True):
    """A message that verified: its timestamp, its nonce (None for a `v1`-only
    message) and the index of the key that matched."""

    timestamp: int
    nonce: str | None
    key_index: int


def verify_signed(
    body: bytes,
    header: str | None,
    *,
    keys: Sequence[str],
    now: int,
    window: int = REPLAY_WINDOW_SECONDS,
    require_nonce: bool = False,
) -> Verified:
    """Check a message's signature under any of `keys` (see the module docstring).

    Does not remember nonces: the caller refuses a second use (`SeenNonces`).

    Raises:
        SignatureError: `signature.missing`, `signature.malformed`,
            `signature.expired` (outside the window), `signature.nonce_required`
            (no `n` with `v2` while nonces are required) or `signature.mismatch`.
    """
    if not header:
        raise SignatureError(f"missing {SIGNATURE_HEADER} header", code="signature.missing")
    parts = parse_signature(header)
    timestamp = parts.timestamp
    if abs(now - timestamp) > window:
        raise SignatureError(
            f"{SIGNATURE_HEADER} timestamp {timestamp} is {now - timestamp}s from now;"
            f" the window is {window}s",
            code="signature.expired",
        )
    candidates = [key for key in keys if key]
    if parts.nonce is not None and parts.v2:
        for index, candidate in enumerate(candidates):
            expected = sign_v2(body, candidate, timestamp, parts.nonce)
            if any(hmac.compare_digest(expected, given) for given in parts.v2):
                return Verified(timestamp=timestamp, nonce=parts.nonce, key_index=index)
    else:
        if require_nonce:
            raise SignatureError(
                f"{SIGNATURE_HEADER} has no n=<nonce> with v2=<hex>; this receiver accepts"
                " only nonce-bearing (v2) signatures",
                code="signature.nonce_required",
            )
        for index, candidate in enumerate(candidates):
            expected = sign(body, candidate, timestamp)
            if any(hmac.compare_digest(expected, given) for given in parts.v1):
                return Verified(timestamp=timestamp, nonce=None, key_index=index)
    raise SignatureError(
        f"{SIGNATURE_HEADER} does not match the body under the signing key or its fallback",
        code="signature.mismatch",
    )


def verify_signature(
    body: bytes,
    header: str | None,
    *,
    key: str,
    fallback_key: str | None = None,
    now: int,
    window: int = REPLAY_WINDOW_SECONDS,
    require_nonce: bool = False,
) -> int:
    """Check a message's signature under `key` or `fallback_key`; return its timestamp.

    Raises:
        SignatureError: see `verify_signed`.
    """
    keys = [key] if not fallback_key else [key, fallback_key]
    return verify_signed(
        body, header, keys=keys, now=now, window=window, require_nonce=require_nonce
    ).timestamp


class SigningKeys:
    """A primary signing key and an optional fallback, for rotation.

    Messages are signed with the primary; a message verifies under either.
    """

    __slots__ = ("fallback", "primary")

    def __init__(self, primary: str, fallback: str | None = None) -> None:
        if not primary:
            raise SignatureError("signing key must not be empty", code="signature.no_key")
        self.primary = primary
        self.fallback = fallback or None

    def header(self, body: bytes, *, now: int, nonce: str | None = None) -> str:
        """The `Ductor-Signature` value for `body` at time `now`, signed with the primary
        (a request passes a fresh `nonce`, see `new_nonce`)."""
        return signature_header(body, [self.primary], now, nonce=nonce)

    def request_header(self, body: bytes, *, now: int) -> str:
        """The `Ductor-Signature` value of a request: signed with the primary under a
        fresh nonce (`v1` and `v2`)."""
        return self.header(body, now=now, nonce=new_nonce())

    def verify(self, body: bytes, header: str | None, *, now: int) -> int:
        """Verify `header` for `body` at time `now` (`v2` or `v1`); return its timestamp.

        Raises:
            SignatureError: see `verify_signed`.
        """
        return self.check(body, header, now=now).timestamp

    def check(
        self, body: bytes, header: str | None, *, now: int, require_nonce: bool = False
    ) -> Verified:
        """Verify `header` for `body` at time `now`; return what verified.

        Raises:
            SignatureError: see `verify_signed`.
        """
        keys = [self.primary] if self.fallback is None else [self.primary, self.fallback]
        return verify_signed(body, header, keys=keys, now=now, require_nonce=require_nonce)


class SeenNonces:
    """The nonces a receiver accepted, each kept until its window has passed.

    In memory and bounded: when `capacity` live nonces are held, a new one is
    refused (`signature.replay_cache_full`, retryable) rather than forgetting a
    nonce that could then be replayed. One instance serves one process.
    """

    __slots__ = ("_expiry", "_heap", "capacity", "window")

    def __init__(self, *, capacity: int = 100_000, window: int = REPLAY_WINDOW_SECONDS) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.window = window
        self._expiry: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._expiry)

    def first_use(self, nonce: str, *, timestamp: int, now: int) -> None:
        """Record `nonce` (of a message signed at `timestamp`) as used at `now`.

        Raises:
            SignatureError: `signature.replayed` when it was seen within its
                window; `signature.replay_cache_full` when no room is left.
        """
        while self._heap and self._heap[0][0] < now:
            _, gone = heapq.heappop(self._heap)
            self._expiry.pop(gone, None)
        if nonce in self._expiry:
            raise SignatureError(
                f"{SIGNATURE_HEADER} nonce {nonce!r} was already used", code="signature.replayed"
            )
        if len(self._expiry) >= self.capacity:
            raise SignatureError(
                f"{len(self._expiry)} nonces are held for the replay window; try again later",
                code="signature.replay_cache_full",
                retryable=True,
            )
        # A message stays acceptable until `now` passes `timestamp + window`.
        expires = timestamp + self.window
        self._expiry[nonce] = expires
        heapq.heappush(self._heap, (expires, nonce))
