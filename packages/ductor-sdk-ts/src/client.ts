/**
 * `Ductor`: one app's connection to Ductor. Workflow registration, the bridge
 * endpoint's five actions (health, describe, sync, execute, cancel), and the
 * SDK's signed calls to the server (sync, payload fetch).
 *
 * Framework-free: adapters turn HTTP into `ductor.handle(...)` and back.
 */

import { canonicalDuration, type Duration, parseDuration } from "./durations.js";
import {
  ApiError,
  DuctorError,
  NonRetriableError,
  ProtocolError,
  SignatureError,
  WorkflowNotFoundError,
} from "./errors.js";
import { type Json, type Jsonify, toJson } from "./json.js";
import {
  APP_HEADER,
  type CancelRequest,
  type CancelResponse,
  DescribeResponse,
  ErrorResponse,
  ExecutePayload,
  type ExecuteRequest,
  ExecuteResponse,
  HealthResponse,
  type Kind,
  PAYLOAD_PATH,
  PROTOCOL_VERSION,
  SIGNATURE_HEADER,
  SYNC_PATH,
  SeenNonces,
  SigningKeys,
  SyncAck,
  SyncResponse,
  CancelResponse as CancelResponseSchema,
  type WorkflowInfo,
  decode,
  decodeRequest,
  encode,
  newNonce,
} from "./protocol.js";
import { type AnyEvents, type Context, type EventSchemas, type WorkflowTarget, errorInfo, executeWorkflow } from "./replay.js";
import { SDK_NAME, SDK_VERSION } from "./version.js";

/** What starts a workflow: an event (with an optional CEL `match`) or a cron. */
export type Trigger<Name extends string = string> =
  | Name
  | { readonly event: Name; readonly match?: string }
  | { readonly cron: string };

/**
 * Limits counted in running steps, per value of the CEL `key` (over the input)
 * if set: at most `limit` at once, at most `rate.limit` starts per `rate.period`
 * (`"1m"`, or milliseconds; `burst` of them at once, default 1, at most
 * `rate.limit`). At least one of `limit` and `rate`.
 */
export interface Concurrency {
  readonly limit?: number;
  readonly key?: string;
  readonly rate?: { readonly limit: number; readonly period: Duration; readonly burst?: number };
}

/** What a cancellation handler gets: the cancelled run and why. */
export interface CancelContext {
  readonly runId: string;
  readonly workflowId: string;
  readonly reason: string | null;
}

/** A workflow body: `async (ctx, input) => output`. */
export type WorkflowFn<Input, Output, Events extends EventSchemas = AnyEvents> = (
  ctx: Context<Events>,
  input: Input,
) => Promise<Output>;

/** Options of {@link Ductor.workflow}. */
export interface WorkflowOptions<Input, Events extends EventSchemas = AnyEvents> {
  /** The workflow's id, unique in this app. */
  readonly id: string;
  /** A human title. */
  readonly name?: string;
  /** Event name(s) or triggers that start a run (its input is the event's data). */
  readonly trigger?: Trigger<keyof Events & string> | readonly Trigger<keyof Events & string>[];
  /** Retries of each step (and of the body) after the first try (default 3). */
  readonly retries?: number;
  /** Max concurrent runs: a number, or a keyed {@link Concurrency}. */
  readonly concurrency?: number | Concurrency;
  /** The longest a run may take (`"1h"`, `"7d"`, or milliseconds). */
  readonly timeout?: Duration;
  /** Called when a run of this workflow is cancelled. */
  readonly onCancel?: (ctx: CancelContext, input: Json) => Promise<void> | void;
  /**
   * Check and convert the run's JSON input before the body sees it (a zod
   * schema's `parse`, say). If it throws, the run fails with
   * `workflow.input_invalid`.
   */
  readonly parseInput?: (input: Json) => Input;
}

/** A registered workflow: its body and the options the engine applies to it. */
export class Workflow<Input, Output> implements WorkflowTarget<Input, Output> {
  declare readonly __input?: (input: Input) => void;
  declare readonly __output?: Output;

  /** @internal */
  constructor(
    readonly appId: string,
    readonly options: WorkflowOptions<Input, never>,
    readonly fn: WorkflowFn<Input, Output, never>,
  ) {}

  /** The workflow's id. */
  get id(): string {
    return this.options.id;
  }

  /** The wire description of this workflow, as `describe` reports it. */
  info(): WorkflowInfo {
    const { id, name, retries = 3, concurrency, timeout, onCancel } = this.options;
    const triggers = this.options.trigger === undefined ? [] : [this.options.trigger].flat();
    return {
      id,
      name: name ?? null,
      // Sent as given, so the server refuses what cannot work (a cron with a match).
      triggers: triggers.map((t) => {
        if (typeof t === "string") return { event: t, cron: null, match: null };
        const { event = null, cron = null, match = null } = t as { event?: string; cron?: string; match?: string };
        return { event, cron, match };
      }),
      retries,
      concurrency:
        concurrency === undefined
          ? null
          : typeof concurrency === "number"
            ? { limit: concurrency, key: null, rate: null }
            : {
                limit: concurrency.limit ?? null,
                key: concurrency.key ?? null,
                rate:
                  concurrency.rate === undefined
                    ? null
                    : {
                        limit: concurrency.rate.limit,
                        period: canonicalDuration(concurrency.rate.period),
                        burst: concurrency.rate.burst ?? 1,
                      },
              },
      timeout: timeout === undefined ? null : canonicalDuration(timeout),
      cancellable: onCancel !== undefined,
    };
  }
}

/** A typed reference to a workflow served by another app (in any language), for `step.invoke`. */
export function workflowRef<Input = Json, Output = Json>(appId: string, id: string): WorkflowTarget<Input, Output> {
  return { appId, id };
}

/** An answer of the bridge endpoint, ready for any HTTP framework to send. */
export interface BridgeResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Uint8Array;
}

/** One HTTP request to the bridge endpoint, as an adapter hands it over. */
export interface BridgeRequestInit {
  /** The HTTP method. */
  readonly method: string;
  /** The request headers (any case). */
  readonly headers: Readonly<Record<string, string | readonly string[] | undefined>> | Headers;
  /** The raw body, exactly as received. */
  readonly body: Uint8Array;
  /** The URL the request reached (used by `sync` when no `url` was configured). */
  readonly url?: string;
}

/** What the adapters serve: anything that answers bridge requests with its keys (a {@link Ductor}). */
export interface BridgeHost {
  /** The keys answers are signed with. */
  readonly keys: SigningKeys;
  /** Answer one request to the bridge endpoint. */
  handle(request: BridgeRequestInit): Promise<BridgeResponse>;
}

/** Options of {@link Ductor}. */
export interface DuctorOptions {
  /** This app's id, unique per server. */
  readonly appId: string;
  /** The app's signing key: signs and verifies every bridge request and response. */
  readonly signingKey: string;
  /** The previous key during rotation (verify only). */
  readonly fallbackSigningKey?: string | null | undefined;
  /** The Ductor server's base URL (default `http://127.0.0.1:7070`). */
  readonly serverUrl?: string | undefined;
  /** Bearer token for the server's API (sync, payload fetch). */
  readonly apiKey?: string | null | undefined;
  /** The public URL of this app's bridge endpoint, sent on sync. */
  readonly url?: string | null | undefined;
  /**
   * Accept only nonce-bearing (`v2`) signatures, each nonce once (default
   * true). Set false only to serve a server that predates nonces.
   */
  readonly requireNonce?: boolean | undefined;
  /** Where accepted nonces are remembered (one per client by default). */
  readonly seenNonces?: SeenNonces | undefined;
  /** Unix time in seconds; injectable for tests. */
  readonly clock?: (() => number) | undefined;
  /** The `fetch` used for calls to the server; injectable for tests. */
  readonly fetch?: typeof fetch | undefined;
  /** Per-call timeout for calls to the server, in milliseconds (default 30 s). */
  readonly timeoutMs?: number | undefined;
}

/**
 * One app's connection to Ductor: its workflows, its keys, its server.
 *
 * `Events` maps event names to their data types; it types triggers and
 * `step.waitForEvent`.
 */
export class Ductor<Events extends EventSchemas = AnyEvents> implements BridgeHost {
  readonly appId: string;
  readonly keys: SigningKeys;
  readonly serverUrl: string;
  readonly apiKey: string | null;
  readonly url: string | null;
  readonly requireNonce: boolean;
  readonly seenNonces: SeenNonces;
  readonly #clock: () => number;
  readonly #fetch: typeof fetch;
  readonly #timeoutMs: number;
  readonly #workflows = new Map<string, Workflow<unknown, unknown>>();

  constructor(options: DuctorOptions) {
    if (!options.appId) throw new TypeError("appId must not be empty");
    // Its runs' family slug is bridge:<appId>:<workflow id>.
    if (options.appId.includes(":")) throw new TypeError(`appId must not contain ':', got '${options.appId}'`);
    this.appId = options.appId;
    this.keys = new SigningKeys(options.signingKey, options.fallbackSigningKey ?? null);
    this.serverUrl = (options.serverUrl ?? "http://127.0.0.1:7070").replace(/\/+$/, "");
    this.apiKey = options.apiKey ?? null;
    this.url = options.url ?? null;
    this.requireNonce = options.requireNonce ?? true;
    this.seenNonces = options.seenNonces ?? new SeenNonces();
    this.#clock = options.clock ?? (() => Date.now() / 1000);
    this.#fetch = options.fetch ?? fetch;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
  }

  // ------------------------------------------------------------ registration

  /**
   * Register `fn` as a workflow of this app.
   *
   * @returns the workflow, which `step.invoke` and the API client accept.
   */
  workflow<Input = Json, Output = unknown>(
    options: WorkflowOptions<Input, Events>,
    fn: WorkflowFn<Input, Output, Events>,
  ): Workflow<Input, Jsonify<Awaited<Output>>> {
    const { id, retries = 3, concurrency, timeout } = options;
    if (typeof id !== "string") throw new TypeError(`workflow id must be a string, got ${JSON.stringify(id)}`);
    if (!id) throw new TypeError("workflow id must not be empty");
    if (this.#workflows.has(id)) throw new TypeError(`workflow '${id}' is already registered on app '${this.appId}'`);
    if (typeof fn !== "function") throw new TypeError(`workflow body must be a function, got ${typeof fn}`);
    if (!Number.isInteger(retries) || retries < 0) throw new RangeError(`retries must be an integer >= 0, got ${given(retries)}`);
    checkText("name", options.name);
    for (const t of options.trigger === undefined ? [] : [options.trigger].flat()) {
      const given = typeof t === "string" ? { event: t } : (t as { event?: unknown; cron?: unknown; match?: unknown });
      if (typeof given !== "object" || given === null || (given.event == null) === (given.cron == null)) {
        throw new TypeError(`a trigger needs exactly one of event and cron, got ${JSON.stringify(t)}`);
      }
      checkText("trigger event", given.event, { empty: false });
      checkText("trigger cron", given.cron);
      checkText("trigger match", given.match);
    }
    if (concurrency !== undefined && typeof concurrency !== "number" && (typeof concurrency !== "object" || concurrency === null)) {
      throw new TypeError(`concurrency must be a number or { limit?, key?, rate? }, got ${JSON.stringify(concurrency)}`);
    }
    const limit = typeof concurrency === "number" ? concurrency : concurrency?.limit;
    if (limit !== undefined && (!Number.isInteger(limit) || limit < 1)) {
      throw new RangeError(`concurrency limit must be an integer >= 1, got ${given(limit)}`);
    }
    if (typeof concurrency === "object") {
      const { rate } = concurrency;
      if (limit === undefined && rate === undefined) {
        throw new RangeError("concurrency needs a limit, a rate, or both");
      }
      if (rate !== undefined) {
        if (typeof rate !== "object" || rate === null) {
          throw new TypeError(`concurrency rate must be { limit, period, burst? }, got ${JSON.stringify(rate)}`);
        }
        if (!Number.isInteger(rate.limit) || rate.limit < 1) {
          throw new RangeError(`concurrency rate limit must be an integer >= 1, got ${given(rate.limit)}`);
        }
        if (rate.burst !== undefined && (!Number.isInteger(rate.burst) || rate.burst < 1 || rate.burst > rate.limit)) {
          throw new RangeError(`concurrency rate burst must be an integer from 1 to the limit (${given(rate.limit)}), got ${given(rate.burst)}`);
        }
        if (parseDuration(canonicalDuration(rate.period)) <= 0) {
          throw new RangeError(`concurrency rate period must be longer than zero, got ${JSON.stringify(rate.period)}`);
        }
      }
      checkText("concurrency key", concurrency.key);
    }
    if (timeout !== undefined && parseDuration(canonicalDuration(timeout)) <= 0) {
      // Every run would time out at once (a sync refuses it too).
      throw new RangeError(`timeout must be longer than zero, got ${JSON.stringify(timeout)}`);
    }
    if (options.onCancel !== undefined && typeof options.onCancel !== "function") {
      throw new TypeError(`onCancel must be a function, got ${typeof options.onCancel}`);
    }
    if (options.parseInput !== undefined && typeof options.parseInput !== "function") {
      throw new TypeError(`parseInput must be a function, got ${typeof options.parseInput}`);
    }
    const wf = new Workflow(this.appId, options, fn as unknown as WorkflowFn<Input, Output, never>);
    this.#workflows.set(id, wf as unknown as Workflow<unknown, unknown>);
    return wf as unknown as Workflow<Input, Jsonify<Awaited<Output>>>;
  }

  /** The registered workflows by id. */
  get workflows(): ReadonlyMap<string, Workflow<unknown, unknown>> {
    return new Map(this.#workflows);
  }

  /** The `describe` payload: this app, its URL and its workflows. */
  describe(url?: string | null): DescribeResponse {
    return {
      app_id: this.appId,
      // An empty configured url is none, as in the Python SDK.
      url: this.url || (url ?? null),
      sdk: SDK_NAME,
      sdk_version: SDK_VERSION,
      protocol: PROTOCOL_VERSION,
      workflows: [...this.#workflows.values()].map((wf) => wf.info()),
    };
  }

  // ------------------------------------------------------------ the bridge endpoint

  /**
   * Answer one HTTP request to the bridge endpoint. GET is `health`,
   * unsigned; POST must carry a valid `Ductor-Signature`, and its body
   * selects the action. Every answer is signed.
   */
  async handle(request: BridgeRequestInit): Promise<BridgeResponse> {
    const method = request.method.toUpperCase();
    if (method === "GET" || method === "HEAD") return this.#respond(200, HealthResponse, this.#health());
    if (method !== "POST") {
      return this.#error(405, new ProtocolError(`method ${method} not allowed; use GET or POST`));
    }
    try {
      this.#verifyRequest(request.body, header(request.headers, SIGNATURE_HEADER));
      const message = decodeRequest(request.body);
      switch (message.action) {
        case "health":
          return this.#respond(200, HealthResponse, this.#health());
        case "describe":
          return this.#respond(200, DescribeResponse, this.describe(request.url));
        case "sync": {
          const ack = await this.sync(message.url || request.url);
          return this.#respond(200, SyncResponse, { app_id: this.appId, synced: true, accepted: ack.accepted });
        }
        case "execute":
          return this.#respond(200, ExecuteResponse, await this.execute(message));
        case "cancel":
          return this.#respond(200, CancelResponseSchema, await this.cancel(message));
      }
    } catch (err) {
      if (err instanceof ApiError) return this.#error(502, err);
      if (err instanceof SignatureError) return this.#error(err.retryable ? 503 : 401, err);
      if (err instanceof DuctorError) return this.#error(statusOf(err), err);
      return this.#error(500, new DuctorError(`internal error in the bridge: ${String(err)}`, { code: "bridge.internal" }));
    }
  }

  #verifyRequest(body: Uint8Array, signature: string | null): void {
    const now = Math.floor(this.#clock());
    const verified = this.keys.check(body, signature, now, this.requireNonce);
    if (verified.nonce !== null) this.seenNonces.firstUse(verified.nonce, verified.timestamp, now);
  }

  /** Advance a run by one execute request. */
  async execute(request: ExecuteRequest): Promise<ExecuteResponse> {
    const wf = this.#workflow(request.workflow_id);
    let { input, steps, event } = request;
    if (request.payload_ref !== null) {
      const payload = await this.#fetchPayload(request.run_id, request.payload_ref);
      ({ input, steps, event } = payload);
    }
    const parse = wf.options.parseInput;
    const body = (ctx: Context, value: Json): Promise<unknown> => {
      let converted: unknown = value;
      if (parse !== undefined) {
        try {
          converted = parse(value);
        } catch (err) {
          throw new NonRetriableError(
            `workflow '${wf.id}' input is invalid: ${err instanceof Error ? err.message : String(err)}`,
            { code: "workflow.input_invalid" },
          );
        }
      }
      return wf.fn(ctx as unknown as Context<never>, converted);
    };
    const opcodes = await executeWorkflow(body, {
      runId: request.run_id,
      workflowId: wf.id,
      attempt: request.attempt,
      input,
      steps,
      event,
      targetStep: request.target_step,
      retries: wf.options.retries ?? 3,
      traceparent: request.traceparent,
    });
    return { run_id: request.run_id, opcodes };
  }

  /** Run the workflow's cancellation handler, if it has one. */
  async cancel(request: CancelRequest): Promise<CancelResponse> {
    const wf = this.#workflow(request.workflow_id);
    const handler = wf.options.onCancel;
    if (handler === undefined) return { run_id: request.run_id, handled: false, error: null };
    try {
      await handler({ runId: request.run_id, workflowId: wf.id, reason: request.reason }, request.input);
    } catch (err) {
      // Read as a step's error is: a thrown value whose text cannot be read is
      // still an answer, not a 500 the engine would retry by cancelling again.
      return { run_id: request.run_id, handled: true, error: errorInfo(err, "cancel.error", false) };
    }
    return { run_id: request.run_id, handled: true, error: null };
  }

  // ------------------------------------------------------------ calls to the server

  /**
   * Register (or refresh) this app and its workflows with the server.
   *
   * @throws ApiError the server refused or could not be reached.
   */
  async sync(url?: string | null): Promise<SyncAck> {
    return this.#call("POST", SYNC_PATH, DescribeResponse, this.describe(url), SyncAck);
  }

  async #fetchPayload(runId: string, ref: string): Promise<ExecutePayload> {
    const path = `${PAYLOAD_PATH.replace("{run_id}", encodeURIComponent(runId))}?ref=${encodeURIComponent(ref)}`;
    const payload = await this.#call("GET", path, null, null, ExecutePayload);
    if (payload.run_id !== runId) {
      throw new ApiError(`payload '${ref}' belongs to run '${payload.run_id}', not '${runId}'`, {
        status: 200,
        code: "payload.run_mismatch",
      });
    }
    return payload;
  }

  /** One signed call to the server's bridge API, with a verified, typed answer. */
  async #call<I, O>(
    method: string,
    path: string,
    schema: Kind<unknown, I> | null,
    body: I | null,
    answer: Kind<O, unknown>,
  ): Promise<O> {
    const content = schema === null || body === null ? new Uint8Array() : encode(schema, body);
    const headers: Record<string, string> = {
      [SIGNATURE_HEADER]: this.keys.header(content, Math.floor(this.#clock()), newNonce()),
      [APP_HEADER]: this.appId,
      "content-type": "application/json",
    };
    if (this.apiKey) headers["authorization"] = `Bearer ${this.apiKey}`;
    let response: Response;
    let raw: Uint8Array;
    try {
      response = await this.#fetch(this.serverUrl + path, {
        method,
        headers,
        ...(method === "GET" ? {} : { body: content as Uint8Array<ArrayBuffer> }),
        signal: AbortSignal.timeout(this.#timeoutMs),
      });
      raw = new Uint8Array(await response.arrayBuffer());
    } catch (err) {
      throw new ApiError(`${method} ${path} failed: ${String(err)}`, {
        status: 0,
        code: "api.unreachable",
        retryable: true,
        cause: err,
      });
    }
    if (response.status >= 400) throw errorAnswer(method, path, response.status, raw);
    try {
      this.keys.check(raw, response.headers.get(SIGNATURE_HEADER), Math.floor(this.#clock()));
    } catch (err) {
      const error = err as SignatureError;
      throw new ApiError(`${method} ${path}: the server's answer failed verification: ${error.message}`, {
        status: response.status,
        code: error.code,
      });
    }
    try {
      return decode(answer, raw);
    } catch (err) {
      throw new ApiError(`${method} ${path}: unexpected answer: ${(err as Error).message}`, {
        status: response.status,
        code: "api.bad_response",
      });
    }
  }

  // ------------------------------------------------------------ internals

  #workflow(workflowId: string): Workflow<unknown, unknown> {
    const wf = this.#workflows.get(workflowId);
    if (wf === undefined) {
      const served = [...this.#workflows.keys()].sort().join(", ") || "none";
      throw new WorkflowNotFoundError(`app '${this.appId}' does not serve workflow '${workflowId}' (serves: ${served})`);
    }
    return wf;
  }

  #health(): HealthResponse {
    return { status: "ok", app_id: this.appId, sdk: SDK_NAME, sdk_version: SDK_VERSION, protocol: PROTOCOL_VERSION };
  }

  #respond<I>(status: number, schema: Kind<unknown, I>, value: I): BridgeResponse {
    const body = encode(schema, value);
    return {
      status,
      headers: {
        "content-type": "application/json",
        [SIGNATURE_HEADER]: this.keys.header(body, Math.floor(this.#clock())),
      },
      body,
    };
  }

  #error(status: number, err: DuctorError): BridgeResponse {
    return this.#respond(status, ErrorResponse, {
      code: err.code,
      message: err.message,
      details: toJsonLoose(err.details),
      retryable: err.retryable,
    });
  }
}

function toJsonLoose(value: unknown): Json {
  try {
    return toJson(value, { replace: true });
  } catch {
    return String(value);
  }
}

function statusOf(err: DuctorError): number {
  if (err instanceof ProtocolError) return 400;
  if (err instanceof WorkflowNotFoundError) return 404;
  return 500;
}

/** A header's value, whatever its case and however the framework holds headers. */
export function header(headers: BridgeRequestInit["headers"], name: string): string | null {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name);
  const lowered = name.toLowerCase();
  for (const [key, value] of Object.entries(headers as Record<string, string | readonly string[] | undefined>)) {
    if (key.toLowerCase() !== lowered || value === undefined) continue;
    return typeof value === "string" ? value : value.join(", ");
  }
  return null;
}

function errorAnswer(method: string, path: string, status: number, raw: Uint8Array): ApiError {
  const retryable = status >= 500 || status === 429;
  try {
    const body = JSON.parse(new TextDecoder().decode(raw)) as { code?: unknown; message?: unknown; details?: unknown };
    if (typeof body.code === "string") {
      return new ApiError(typeof body.message === "string" ? body.message : `${method} ${path} answered ${status}`, {
        status,
        code: body.code,
        details: body.details ?? null,
        retryable,
      });
    }
  } catch {
    // not JSON: report the text below
  }
  const text = new TextDecoder().decode(raw.slice(0, 200));
  return new ApiError(`${method} ${path} answered ${status}: ${text}`, { status, retryable });
}

/** Refuse what is neither absent nor a string (nor an empty one, unless `empty`), for untyped callers. */
function checkText(what: string, value: unknown, { empty = true }: { empty?: boolean } = {}): void {
  if (value === undefined || value === null) return;
  if (typeof value !== "string") throw new TypeError(`${what} must be a string, got ${JSON.stringify(value)}`);
  if (!empty && value === "") throw new TypeError(`${what} must not be empty`);
}

/** A refused option's value as the message shows it: text quoted, so `"3"` is not read as the number 3. */
function given(value: unknown): string {
  return typeof value === "string" ? JSON.stringify(value) : String(value);
}
