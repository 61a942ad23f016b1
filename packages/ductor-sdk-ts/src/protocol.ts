/**
 * The bridge wire protocol: envelopes, opcodes, step ids and HMAC signing,
 * byte for byte as the Python SDK's `ductor.protocol` (which the server
 * imports). The golden vectors in `tests/contract/vectors/` pin both.
 *
 * Wire rules (see docs/sdk.md, "Wire protocol"):
 * - Bodies are compact JSON, UTF-8, fields in the order declared here, the
 *   tag (`action` for requests, `op` for opcodes) first, every field present
 *   (absent values are `null`). Decoders reject unknown fields.
 * - Every request and response carries `Ductor-Signature`; the key is the
 *   UTF-8 bytes of the signing key, signatures are lowercase hex HMAC-SHA256:
 *   `v1=` over `"<t>." + body`, `v2=` over `"<t>.<n>." + body` where `n` is a
 *   fresh request id (16 to 64 characters of `[0-9A-Za-z_-]`). A request is
 *   `t=..,n=..,v1=..,v2=..`; a response `t=..,v1=..`.
 * - A verifier refuses a `t` more than {@link REPLAY_WINDOW_SECONDS} from its
 *   clock; with `n` and a `v2` it accepts a matching `v2` (under any key) and
 *   reports the nonce, without them a matching `v1` unless it requires nonces.
 *   A receiver that requires nonces accepts each once ({@link SeenNonces}).
 * - Step ids are the first 32 hex digits of SHA-256 of the step's key: its
 *   name for its first use in a run, then `name:1`, `name:2`, ...
 *
 * Only `node:crypto` is used: no other I/O, no clock reads (callers pass `now`).
 */

import { createHash, createHmac, randomBytes, timingSafeEqual } from "node:crypto";

import { ProtocolError, SignatureError } from "./errors.js";
import { JsonError, utf8 } from "./json.js";
import {
  type Infer,
  type Kind,
  any,
  bool,
  boolOr,
  int,
  intOr,
  list,
  literal,
  nullable,
  oneOf,
  readAs,
  str,
  strOr,
  struct,
  union,
  writeAs,
} from "./wire.js";

export type { Infer, Input, Kind } from "./wire.js";

/** Version of this wire protocol, sent in `health` and `describe`. */
export const PROTOCOL_VERSION = "1";
/** The one header that carries the timestamp and HMAC signatures. */
export const SIGNATURE_HEADER = "Ductor-Signature";
/** On a request to the server: the app whose keys the signature is checked with. */
export const APP_HEADER = "Ductor-App";
/** A signed message older or newer than this (seconds) is rejected. */
export const REPLAY_WINDOW_SECONDS = 300;
/** Above this encoded size the engine sends `payload_ref` instead of input and steps. */
export const INLINE_LIMIT_BYTES = 1_048_576;
/** Where adapters mount the app's bridge endpoint by default. */
export const BRIDGE_PATH = "/api/ductor";
/** Server: POST a `DescribeResponse` to register or refresh an app -> `SyncAck`. */
export const SYNC_PATH = "/v1/bridge/sync";
/** Server: POST an `InlineRunRequest` to start a run executed by the caller. */
export const INLINE_RUN_PATH = "/v1/bridge/runs";
/** Server: POST a `CheckpointRequest` with opcodes produced in-process. */
export const CHECKPOINT_PATH = "/v1/bridge/runs/{run_id}/checkpoint";
/** Server: GET (query `ref`) the `ExecutePayload` an execute request referred to. */
export const PAYLOAD_PATH = "/v1/bridge/runs/{run_id}/payload";
/** The longest `Ductor-Signature` value accepted. */
export const MAX_SIGNATURE_HEADER_LENGTH = 1024;

/** Every opcode an execute response (or a checkpoint) can carry. */
export const OPCODE_NAMES = [
  "STEP_RUN",
  "STEP_ERROR",
  "STEP_FAILED",
  "STEP_PLANNED",
  "SLEEP",
  "WAIT_FOR_EVENT",
  "WAIT_FOR_SIGNAL",
  "INVOKE",
  "RUN_COMPLETE",
  "RUN_ERROR",
  "RUN_FAILED",
] as const;
/** The name of an opcode. */
export type OpcodeName = (typeof OPCODE_NAMES)[number];

const optStr = nullable(str);

// ---------------------------------------------------------------- shared values

/** An error as it travels: stable `code`, human `message`, and whether to retry. */
export const ErrorInfo = struct("ErrorInfo", {
  code: str,
  message: str,
  name: optStr,
  retryable: boolOr(false),
  details: any,
});
export type ErrorInfo = Infer<typeof ErrorInfo>;

/** An event: its `name`, `data`, optional `id` and ISO-8601 UTC `ts`. */
export const Event = struct("Event", { name: str, data: any, id: optStr, ts: optStr });
export type Event = Infer<typeof Event>;

/** A signal sent to a run: its `name` and `data`. */
export const Signal = struct("Signal", { name: str, data: any });
export type Signal = Infer<typeof Signal>;

/** One recorded step of a run, in the order the engine recorded it. */
export const StepRecord = struct("StepRecord", {
  id: str,
  name: str,
  op: oneOf(OPCODE_NAMES),
  result: any,
  error: nullable(ErrorInfo),
});
export type StepRecord = Infer<typeof StepRecord>;

// ---------------------------------------------------------------- requests to the app

const action = <V extends string>(value: V) => ({ field: "action", value }) as const;

/** Liveness. Also served, unsigned, as a plain GET on the bridge path. */
export const HealthRequest = struct("HealthRequest", { action: literal("health", false) }, action("health"));
/** Ask the app which workflows, triggers and options it serves. */
export const DescribeRequest = struct(
  "DescribeRequest",
  { action: literal("describe", false) },
  action("describe"),
);
/** Ask the app to POST its describe payload to the server's `SYNC_PATH`. */
export const SyncRequest = struct("SyncRequest", { action: literal("sync", false), url: optStr }, action("sync"));
/** Advance a run: replay `steps` and report what happens next as opcodes. */
export const ExecuteRequest = struct(
  "ExecuteRequest",
  {
    action: literal("execute", false),
    run_id: str,
    workflow_id: str,
    attempt: intOr(0),
    input: any,
    steps: list(StepRecord),
    event: nullable(Event),
    target_step: optStr,
    payload_ref: optStr,
    traceparent: optStr,
  },
  action("execute"),
);
/** A run was cancelled: run the workflow's cancellation handler, if any. */
export const CancelRequest = struct(
  "CancelRequest",
  { action: literal("cancel", false), run_id: str, workflow_id: str, input: any, reason: optStr },
  action("cancel"),
);
export type HealthRequest = Infer<typeof HealthRequest>;
export type DescribeRequest = Infer<typeof DescribeRequest>;
export type SyncRequest = Infer<typeof SyncRequest>;
export type ExecuteRequest = Infer<typeof ExecuteRequest>;
export type CancelRequest = Infer<typeof CancelRequest>;

/** Any POST body the engine sends to the bridge endpoint. */
export const BridgeRequest = union("action", [
  HealthRequest,
  DescribeRequest,
  SyncRequest,
  ExecuteRequest,
  CancelRequest,
]);
export type BridgeRequest = Infer<typeof BridgeRequest>;

// ---------------------------------------------------------------- opcodes

const op = <V extends OpcodeName>(value: V) => ({ field: "op", value }) as const;

/** A step ran and succeeded: record `result` under `id`. */
export const StepRunOp = struct("StepRunOp", { op: literal("STEP_RUN", false), id: str, name: str, result: any }, op("STEP_RUN"));
/** A step threw a retriable error: retry it, not before `retry_after` if set. */
export const StepErrorOp = struct(
  "StepErrorOp",
  { op: literal("STEP_ERROR", false), id: str, name: str, error: ErrorInfo, retry_after: optStr },
  op("STEP_ERROR"),
);
/** A step failed for good: record `error` under `id` and call execute again. */
export const StepFailedOp = struct(
  "StepFailedOp",
  { op: literal("STEP_FAILED", false), id: str, name: str, error: ErrorInfo },
  op("STEP_FAILED"),
);
/** A step was found but not run (parallel branch): run it with `target_step`. */
export const StepPlannedOp = struct(
  "StepPlannedOp",
  { op: literal("STEP_PLANNED", false), id: str, name: str },
  op("STEP_PLANNED"),
);
/** Wait for a `duration` ("10m") or `until` an ISO-8601 UTC time; record null. */
export const SleepOp = struct(
  "SleepOp",
  { op: literal("SLEEP", false), id: str, name: str, duration: optStr, until: optStr },
  op("SLEEP"),
);
/** Wait for an event named `event` whose CEL `match` holds; record it, or null on timeout. */
export const WaitForEventOp = struct(
  "WaitForEventOp",
  { op: literal("WAIT_FOR_EVENT", false), id: str, name: str, event: str, match: optStr, timeout: str },
  op("WAIT_FOR_EVENT"),
);
/** Wait for a signal named `signal` sent to this run; record it, or null on timeout. */
export const WaitForSignalOp = struct(
  "WaitForSignalOp",
  { op: literal("WAIT_FOR_SIGNAL", false), id: str, name: str, signal: str, timeout: str },
  op("WAIT_FOR_SIGNAL"),
);
/** Start a child run of `workflow` (with `app_id`: an SDK workflow) and record its output. */
export const InvokeOp = struct(
  "InvokeOp",
  {
    op: literal("INVOKE", false),
    id: str,
    name: str,
    workflow: str,
    app_id: optStr,
    input: any,
    version: nullable(int),
    timeout: optStr,
  },
  op("INVOKE"),
);
/** The workflow returned: the run succeeded with `output`. */
export const RunCompleteOp = struct("RunCompleteOp", { op: literal("RUN_COMPLETE", false), output: any }, op("RUN_COMPLETE"));
/** The workflow body threw a retriable error: execute again later. */
export const RunErrorOp = struct(
  "RunErrorOp",
  { op: literal("RUN_ERROR", false), error: ErrorInfo, retry_after: optStr },
  op("RUN_ERROR"),
);
/** The workflow body failed for good (or its code changed): the run fails. */
export const RunFailedOp = struct("RunFailedOp", { op: literal("RUN_FAILED", false), error: ErrorInfo }, op("RUN_FAILED"));

export type StepRunOp = Infer<typeof StepRunOp>;
export type StepErrorOp = Infer<typeof StepErrorOp>;
export type StepFailedOp = Infer<typeof StepFailedOp>;
export type StepPlannedOp = Infer<typeof StepPlannedOp>;
export type SleepOp = Infer<typeof SleepOp>;
export type WaitForEventOp = Infer<typeof WaitForEventOp>;
export type WaitForSignalOp = Infer<typeof WaitForSignalOp>;
export type InvokeOp = Infer<typeof InvokeOp>;
export type RunCompleteOp = Infer<typeof RunCompleteOp>;
export type RunErrorOp = Infer<typeof RunErrorOp>;
export type RunFailedOp = Infer<typeof RunFailedOp>;

/** Any opcode. */
export const Opcode = union("op", [
  StepRunOp,
  StepErrorOp,
  StepFailedOp,
  StepPlannedOp,
  SleepOp,
  WaitForEventOp,
  WaitForSignalOp,
  InvokeOp,
  RunCompleteOp,
  RunErrorOp,
  RunFailedOp,
]);
export type Opcode = Infer<typeof Opcode>;

// ---------------------------------------------------------------- responses from the app

/** The app is up: who it is and which protocol it speaks. */
export const HealthResponse = struct("HealthResponse", {
  status: literal("ok", true),
  app_id: str,
  sdk: str,
  sdk_version: str,
  protocol: strOr(PROTOCOL_VERSION),
});
/** What starts a workflow: an `event` name (with an optional CEL `match`) or a `cron`. */
export const TriggerInfo = struct("TriggerInfo", { event: optStr, cron: optStr, match: optStr });
/** At most `limit` step starts per `period` ("1m"), `burst` of them at once. */
export const RateInfo = struct(
  "RateInfo",
  { limit: int, period: str, burst: intOr(1) },
  undefined,
  { omitDefaults: true },
);
/**
 * At most `limit` steps running at once and at most `rate` step starts, per
 * value of the CEL `key` (over the input) when one is set; at least one of the two.
 */
export const ConcurrencyInfo = struct(
  "ConcurrencyInfo",
  { limit: nullable(int), key: optStr, rate: nullable(RateInfo) },
  undefined,
  { omitDefaults: true },
);
/** One workflow the app serves, with its options. */
export const WorkflowInfo = struct("WorkflowInfo", {
  id: str,
  name: optStr,
  triggers: list(TriggerInfo),
  retries: int,
  concurrency: nullable(ConcurrencyInfo),
  timeout: optStr,
  cancellable: boolOr(false),
});
/** The workflows, triggers and options this app serves; also the sync body. */
export const DescribeResponse = struct("DescribeResponse", {
  app_id: str,
  url: optStr,
  sdk: str,
  sdk_version: str,
  protocol: strOr(PROTOCOL_VERSION),
  workflows: list(WorkflowInfo),
});
/** The answer to the `sync` action: the server's acknowledgement. */
export const SyncResponse = struct("SyncResponse", { app_id: str, synced: bool, accepted: list(str) });
/** What happened in this execute: one or more opcodes. */
export const ExecuteResponse = struct("ExecuteResponse", { run_id: str, opcodes: list(Opcode, false) });
/** Whether a cancellation handler ran, and its error if it threw. */
export const CancelResponse = struct("CancelResponse", {
  run_id: str,
  handled: bool,
  error: nullable(ErrorInfo),
});
/** The body of any non-2xx answer, on both sides of the bridge. */
export const ErrorResponse = struct("ErrorResponse", {
  code: str,
  message: str,
  details: any,
  retryable: boolOr(false),
});

export type HealthResponse = Infer<typeof HealthResponse>;
export type TriggerInfo = Infer<typeof TriggerInfo>;
export type ConcurrencyInfo = Infer<typeof ConcurrencyInfo>;
export type RateInfo = Infer<typeof RateInfo>;
export type WorkflowInfo = Infer<typeof WorkflowInfo>;
export type DescribeResponse = Infer<typeof DescribeResponse>;
export type SyncResponse = Infer<typeof SyncResponse>;
export type ExecuteResponse = Infer<typeof ExecuteResponse>;
export type CancelResponse = Infer<typeof CancelResponse>;
export type ErrorResponse = Infer<typeof ErrorResponse>;

// ---------------------------------------------------------------- the server's bridge endpoints

/** The server's answer to `POST SYNC_PATH`: the workflow ids it registered. */
export const SyncAck = struct("SyncAck", { app_id: str, accepted: list(str) });
/** `POST INLINE_RUN_PATH`: start a run the calling process executes itself. */
export const InlineRunRequest = struct("InlineRunRequest", { app_id: str, workflow_id: str, input: any });
/** The run the server created for an inline run. */
export const InlineRunResponse = struct("InlineRunResponse", { run_id: str, workflow_id: str });
/** `POST CHECKPOINT_PATH`: opcodes the app produced in-process, in order. */
export const CheckpointRequest = struct("CheckpointRequest", {
  run_id: str,
  app_id: str,
  workflow_id: str,
  opcodes: list(Opcode, false),
});
/** The server recorded the first `recorded` opcodes of a checkpoint. */
export const CheckpointAck = struct("CheckpointAck", { run_id: str, recorded: int });
/** `GET PAYLOAD_PATH?ref=...`: the parts of an execute request not inlined. */
export const ExecutePayload = struct("ExecutePayload", {
  run_id: str,
  input: any,
  steps: list(StepRecord),
  event: nullable(Event),
});

export type SyncAck = Infer<typeof SyncAck>;
export type InlineRunRequest = Infer<typeof InlineRunRequest>;
export type InlineRunResponse = Infer<typeof InlineRunResponse>;
export type CheckpointRequest = Infer<typeof CheckpointRequest>;
export type CheckpointAck = Infer<typeof CheckpointAck>;
export type ExecutePayload = Infer<typeof ExecutePayload>;

/** Every named wire schema, by its Python class name (the vectors' `type` / `class`). */
export const SCHEMAS = {
  BridgeRequest,
  Opcode,
  ErrorInfo,
  Event,
  Signal,
  StepRecord,
  HealthRequest,
  DescribeRequest,
  SyncRequest,
  ExecuteRequest,
  CancelRequest,
  StepRunOp,
  StepErrorOp,
  StepFailedOp,
  StepPlannedOp,
  SleepOp,
  WaitForEventOp,
  WaitForSignalOp,
  InvokeOp,
  RunCompleteOp,
  RunErrorOp,
  RunFailedOp,
  HealthResponse,
  TriggerInfo,
  ConcurrencyInfo,
  RateInfo,
  WorkflowInfo,
  DescribeResponse,
  SyncResponse,
  ExecuteResponse,
  CancelResponse,
  ErrorResponse,
  SyncAck,
  InlineRunRequest,
  InlineRunResponse,
  CheckpointRequest,
  CheckpointAck,
  ExecutePayload,
} as const;

/**
 * The history record the engine stores once a step opcode has resolved:
 * `STEP_RUN` keeps its result and `STEP_FAILED` its error; give `result` for
 * a resolved wait or a child's output and `error` for a failed child.
 */
export function stepRecord(
  resolved: StepRunOp | StepFailedOp | SleepOp | WaitForEventOp | WaitForSignalOp | InvokeOp,
  outcome: { result?: unknown; error?: ErrorInfo | null } = {},
): StepRecord {
  const base = { id: resolved.id, name: resolved.name, op: resolved.op };
  switch (resolved.op) {
    case "STEP_RUN":
      return { ...base, result: resolved.result, error: null };
    case "STEP_FAILED":
      return { ...base, result: null, error: resolved.error };
    case "SLEEP":
      return { ...base, result: null, error: null };
    case "INVOKE":
      return { ...base, result: (outcome.result ?? null) as StepRecord["result"], error: outcome.error ?? null };
    default:
      return { ...base, result: (outcome.result ?? null) as StepRecord["result"], error: null };
  }
}

// ---------------------------------------------------------------- encoding

const ENCODER = new TextEncoder();

/** Encode a wire message as `schema` to its canonical JSON bytes. */
export function encode<I>(schema: Kind<unknown, I>, value: I): Uint8Array {
  return ENCODER.encode(writeAs(schema, value));
}

/** Encode a wire message as `schema` to its canonical JSON text. */
export function encodeText<I>(schema: Kind<unknown, I>, value: I): string {
  return writeAs(schema, value);
}

/**
 * Decode a wire body as `schema` (e.g. `ExecuteResponse` on the engine's side).
 *
 * @throws ProtocolError the body does not decode as `schema`.
 */
export function decode<O>(schema: Kind<O, unknown>, body: Uint8Array | string): O {
  try {
    return readAs(schema, typeof body === "string" ? body : utf8(body));
  } catch (err) {
    if (err instanceof JsonError) throw new ProtocolError(`invalid ${schema.label}: ${err.message}`);
    throw err;
  }
}

/**
 * Decode a bridge POST body into one of the five actions.
 *
 * @throws ProtocolError the body is not a valid request envelope.
 */
export function decodeRequest(body: Uint8Array | string): BridgeRequest {
  try {
    return readAs(BridgeRequest, typeof body === "string" ? body : utf8(body));
  } catch (err) {
    if (err instanceof JsonError) throw new ProtocolError(`invalid bridge request: ${err.message}`);
    throw err;
  }
}

// ---------------------------------------------------------------- step ids

const ids = new Map<string, string>();

/** The wire id of a step: the first 32 hex digits of SHA-256 of its key. */
export function stepId(key: string): string {
  let id = ids.get(key);
  if (id === undefined) {
    id = createHash("sha256").update(key, "utf8").digest("hex").slice(0, 32);
    if (ids.size >= 16_384) ids.clear();
    ids.set(key, id);
  }
  return id;
}

/**
 * Numbers repeated step names within one run: `name`, `name:1`, `name:2`, ...
 * A key already taken (even by a user name such as `"a:1"`) moves on to the
 * next number, so keys never collide.
 */
export class StepKeys {
  private readonly used = new Set<string>();
  private readonly next = new Map<string, number>();

  /** The next unused key for `name`, marked used. */
  key(name: string): string {
    let n = this.next.get(name) ?? 0;
    let key = n === 0 ? name : `${name}:${n}`;
    while (this.used.has(key)) {
      n += 1;
      key = `${name}:${n}`;
    }
    this.next.set(name, n + 1);
    this.used.add(key);
    return key;
  }
}

// ---------------------------------------------------------------- signing

type Body = Uint8Array | string;

function hmacHex(key: string, prefix: string, body: Body): string {
  const mac = createHmac("sha256", Buffer.from(key, "utf8"));
  mac.update(prefix, "ascii");
  mac.update(typeof body === "string" ? Buffer.from(body, "utf8") : body);
  return mac.digest("hex");
}

function noKey(): SignatureError {
  return new SignatureError("signing key must not be empty", { code: "signature.no_key" });
}

/** The `v1` signature: HMAC-SHA256 of `"<t>."` + body, lowercase hex. */
export function sign(body: Body, key: string, timestamp: number): string {
  if (!key) throw noKey();
  return hmacHex(key, `${timestamp}.`, body);
}

/** The `v2` signature: HMAC-SHA256 of `"<t>.<n>."` + body, lowercase hex. */
export function signV2(body: Body, key: string, timestamp: number, nonce: string): string {
  if (!key) throw noKey();
  checkNonce(nonce);
  return hmacHex(key, `${timestamp}.${nonce}.`, body);
}

/** A fresh request id for `n=`: 32 hex digits from the OS random source. */
export function newNonce(): string {
  return randomBytes(16).toString("hex");
}

/**
 * The `Ductor-Signature` value: `t=<timestamp>` and one `v1=` per key, in order;
 * with `nonce` (a request) `t=..,n=..`, the `v1`s, then one `v2=` per key.
 */
export function signatureHeader(
  body: Body,
  keys: readonly string[],
  timestamp: number,
  options: { nonce?: string | undefined } = {},
): string {
  const { nonce } = options;
  const parts = [`t=${timestamp}`];
  if (nonce !== undefined) parts.push(`n=${nonce}`);
  for (const key of keys) parts.push(`v1=${sign(body, key, timestamp)}`);
  if (nonce !== undefined) for (const key of keys) parts.push(`v2=${signV2(body, key, timestamp, nonce)}`);
  return parts.join(",");
}

const NONCE = /^[0-9A-Za-z_-]{16,64}$/;
const HEX64 = /^[0-9a-f]{64}$/;
const DIGITS = /^[0-9]{1,15}$/;
// What Python's str.strip() removes (str.isspace()), so headers split alike.
const PY_SPACE = "\\t\\n\\v\\f\\r\\x1c-\\x20\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const STRIP = new RegExp(`^[${PY_SPACE}]+|[${PY_SPACE}]+$`, "g");

function malformed(reason: string): SignatureError {
  return new SignatureError(`malformed ${SIGNATURE_HEADER} header: ${reason}`, { code: "signature.malformed" });
}

function checkNonce(nonce: string): void {
  if (!NONCE.test(nonce)) throw malformed("n must be 16 to 64 characters of [0-9A-Za-z_-]");
}

function hexSignature(scheme: string, value: string): string {
  const signature = value.toLowerCase();
  if (!HEX64.test(signature)) throw malformed(`${scheme} must be 64 hex digits`);
  return signature;
}

/** A parsed `Ductor-Signature`: the timestamp, the nonce if any, and the signatures. */
export interface SignatureParts {
  readonly timestamp: number;
  readonly nonce: string | null;
  readonly v1: readonly string[];
  /** Empty when there is no nonce (a `v2` without `n` is ignored). */
  readonly v2: readonly string[];
}

/**
 * Split a `Ductor-Signature` value into its parts. Unknown schemes are
 * ignored; the whole value is at most {@link MAX_SIGNATURE_HEADER_LENGTH}.
 *
 * @throws SignatureError `signature.malformed`.
 */
export function parseSignature(header: string): SignatureParts {
  if (header.length > MAX_SIGNATURE_HEADER_LENGTH) {
    throw malformed(`longer than ${MAX_SIGNATURE_HEADER_LENGTH} characters`);
  }
  let timestamp: number | null = null;
  let nonce: string | null = null;
  const v1: string[] = [];
  const v2Raw: string[] = [];
  for (const raw of header.split(",")) {
    const item = raw.replace(STRIP, "");
    const eq = item.indexOf("=");
    if (eq < 0) throw malformed(`'${item}' is not key=value`);
    const name = item.slice(0, eq);
    const value = item.slice(eq + 1);
    if (name === "t") {
      if (timestamp !== null || !DIGITS.test(value)) throw malformed(`bad timestamp '${value}' (1 to 15 digits)`);
      timestamp = Number(value);
    } else if (name === "n") {
      if (nonce !== null) throw malformed("more than one n=<nonce>");
      checkNonce(value);
      nonce = value;
    } else if (name === "v1") {
      v1.push(hexSignature("v1", value));
    } else if (name === "v2") {
      v2Raw.push(value);
    }
  }
  if (timestamp === null) throw malformed("no t=<unix seconds>");
  const v2 = nonce !== null ? v2Raw.map((value) => hexSignature("v2", value)) : [];
  if (v1.length === 0 && v2.length === 0) throw malformed("no v1=<hex> signature (nor n=<nonce> with v2=<hex>)");
  return { timestamp, nonce, v1, v2 };
}

/** A message that verified: its timestamp, its nonce (null for `v1` only) and the key's index. */
export interface Verified {
  readonly timestamp: number;
  readonly nonce: string | null;
  readonly keyIndex: number;
}

/** Options of {@link verifySigned}. */
export interface VerifyOptions {
  /** The keys a message may be signed with, primary first. */
  readonly keys: readonly string[];
  /** The verifier's clock, in unix seconds. */
  readonly now: number;
  /** The replay window in seconds (default {@link REPLAY_WINDOW_SECONDS}). */
  readonly window?: number;
  /** Accept only nonce-bearing (`v2`) signatures. */
  readonly requireNonce?: boolean;
}

function same(expected: string, given: string): boolean {
  return timingSafeEqual(Buffer.from(expected, "ascii"), Buffer.from(given, "ascii"));
}

/**
 * Check a message's signature under any of `keys`. Does not remember nonces:
 * the caller refuses a second use ({@link SeenNonces}).
 *
 * @throws SignatureError `signature.missing`, `signature.malformed`,
 *   `signature.expired`, `signature.nonce_required` or `signature.mismatch`.
 */
export function verifySigned(body: Body, header: string | null | undefined, options: VerifyOptions): Verified {
  const { now, window = REPLAY_WINDOW_SECONDS, requireNonce = false } = options;
  if (!header) throw new SignatureError(`missing ${SIGNATURE_HEADER} header`, { code: "signature.missing" });
  const parts = parseSignature(header);
  const { timestamp } = parts;
  if (Math.abs(now - timestamp) > window) {
    throw new SignatureError(
      `${SIGNATURE_HEADER} timestamp ${timestamp} is ${now - timestamp}s from now; the window is ${window}s`,
      { code: "signature.expired" },
    );
  }
  const candidates = options.keys.filter((key) => key);
  if (parts.nonce !== null && parts.v2.length > 0) {
    const nonce = parts.nonce;
    for (const [index, candidate] of candidates.entries()) {
      const expected = signV2(body, candidate, timestamp, nonce);
      if (parts.v2.some((given) => same(expected, given))) return { timestamp, nonce, keyIndex: index };
    }
  } else {
    if (requireNonce) {
      throw new SignatureError(
        `${SIGNATURE_HEADER} has no n=<nonce> with v2=<hex>; this receiver accepts only nonce-bearing (v2) signatures`,
        { code: "signature.nonce_required" },
      );
    }
    for (const [index, candidate] of candidates.entries()) {
      const expected = sign(body, candidate, timestamp);
      if (parts.v1.some((given) => same(expected, given))) return { timestamp, nonce: null, keyIndex: index };
    }
  }
  throw new SignatureError(`${SIGNATURE_HEADER} does not match the body under the signing key or its fallback`, {
    code: "signature.mismatch",
  });
}

/**
 * Check a message's signature under `key` or `fallbackKey`; return its timestamp.
 *
 * @throws SignatureError see {@link verifySigned}.
 */
export function verifySignature(
  body: Body,
  header: string | null | undefined,
  options: {
    key: string;
    fallbackKey?: string | null | undefined;
    now: number;
    window?: number;
    requireNonce?: boolean;
  },
): number {
  const keys = options.fallbackKey ? [options.key, options.fallbackKey] : [options.key];
  return verifySigned(body, header, { ...options, keys }).timestamp;
}

/** A primary signing key and an optional fallback, for rotation. */
export class SigningKeys {
  readonly primary: string;
  readonly fallback: string | null;

  constructor(primary: string, fallback?: string | null) {
    if (!primary) throw noKey();
    this.primary = primary;
    this.fallback = fallback || null;
  }

  /** The `Ductor-Signature` of `body` at `now`, signed with the primary (a request passes a nonce). */
  header(body: Body, now: number, nonce?: string): string {
    return signatureHeader(body, [this.primary], now, { nonce });
  }

  /** The `Ductor-Signature` of a request: signed with the primary under a fresh nonce. */
  requestHeader(body: Body, now: number): string {
    return this.header(body, now, newNonce());
  }

  /**
   * Verify `header` for `body` at `now` under the primary or the fallback.
   *
   * @throws SignatureError see {@link verifySigned}.
   */
  check(body: Body, header: string | null | undefined, now: number, requireNonce = false): Verified {
    const keys = this.fallback === null ? [this.primary] : [this.primary, this.fallback];
    return verifySigned(body, header, { keys, now, requireNonce });
  }
}

/**
 * The nonces a receiver accepted, each kept until its window has passed. In
 * memory and bounded: when `capacity` live nonces are held, a new one is
 * refused (`signature.replay_cache_full`, retryable) rather than forgetting a
 * nonce that could then be replayed. One instance serves one process.
 */
export class SeenNonces {
  readonly capacity: number;
  readonly window: number;
  private readonly expiry = new Map<string, number>();
  private readonly heap: [number, string][] = [];

  constructor(options: { capacity?: number; window?: number } = {}) {
    const { capacity = 100_000, window = REPLAY_WINDOW_SECONDS } = options;
    if (!(capacity >= 1)) throw new RangeError(`capacity must be at least 1, got ${capacity}`);
    this.capacity = capacity;
    this.window = window;
  }

  /** How many nonces are held. */
  get size(): number {
    return this.expiry.size;
  }

  /**
   * Record `nonce` (of a message signed at `timestamp`) as used at `now`.
   *
   * @throws SignatureError `signature.replayed` when it was seen within its
   *   window; `signature.replay_cache_full` when no room is left.
   */
  firstUse(nonce: string, timestamp: number, now: number): void {
    while (this.heap.length > 0 && (this.heap[0]?.[0] ?? Infinity) < now) {
      const gone = this.pop();
      if (gone !== undefined && this.expiry.get(gone[1]) === gone[0]) this.expiry.delete(gone[1]);
    }
    if (this.expiry.has(nonce)) {
      throw new SignatureError(`${SIGNATURE_HEADER} nonce '${nonce}' was already used`, { code: "signature.replayed" });
    }
    if (this.expiry.size >= this.capacity) {
      throw new SignatureError(`${this.expiry.size} nonces are held for the replay window; try again later`, {
        code: "signature.replay_cache_full",
        retryable: true,
      });
    }
    const expires = timestamp + this.window;
    this.expiry.set(nonce, expires);
    this.push([expires, nonce]);
  }

  private push(item: [number, string]): void {
    const heap = this.heap;
    heap.push(item);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      const p = heap[parent] as [number, string];
      if (p[0] <= item[0]) break;
      heap[i] = p;
      i = parent;
    }
    heap[i] = item;
  }

  private pop(): [number, string] | undefined {
    const heap = this.heap;
    const top = heap[0];
    const last = heap.pop();
    if (heap.length === 0 || last === undefined) return top;
    let i = 0;
    for (;;) {
      const left = 2 * i + 1;
      if (left >= heap.length) break;
      const right = left + 1;
      const child = right < heap.length && (heap[right] as [number, string])[0] < (heap[left] as [number, string])[0] ? right : left;
      const c = heap[child] as [number, string];
      if (c[0] >= last[0]) break;
      heap[i] = c;
      i = child;
    }
    heap[i] = last;
    return top;
  }
}
