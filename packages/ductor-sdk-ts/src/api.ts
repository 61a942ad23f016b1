/**
 * A small typed client of the Ductor REST API: trigger runs, send events and
 * signals, read, cancel and wait for runs. Every call sends `Authorization:
 * Bearer <api key>`; an error answer (`{"code", "message", "details"}`)
 * throws {@link ApiError} with its code and status; `waitForResult` that
 * gives up throws {@link WaitTimeoutError}. Answers are read
 * leniently (unknown fields kept) so a newer server works.
 */

import { ApiError, WaitTimeoutError } from "./errors.js";
import { type Json, type Jsonify, parseJson, stringifyJson, toJson } from "./json.js";
import type { WorkflowTarget } from "./replay.js";

export { ApiError, WaitTimeoutError } from "./errors.js";

/** Where `ductor dev` serves by default. */
export const DEFAULT_BASE_URL = "http://127.0.0.1:7070";

/** A run's status as the API reports it. */
export type RunStatus =
  | "RUN_STATUS_PENDING"
  | "RUN_STATUS_RUNNING"
  | "RUN_STATUS_SUCCEEDED"
  | "RUN_STATUS_FAILED"
  | "RUN_STATUS_CANCELLED";

/** Statuses a run never leaves. */
export const TERMINAL_STATUSES: ReadonlySet<string> = new Set([
  "RUN_STATUS_SUCCEEDED",
  "RUN_STATUS_FAILED",
  "RUN_STATUS_CANCELLED",
]);

/** A run's error as the API reports it. */
export interface RunError {
  readonly code: string;
  readonly message: string;
  readonly details?: Json;
  readonly [field: string]: unknown;
}

/** One step of a run as `GET /v1/runs/{id}` reports it. */
export interface RunStep {
  readonly ref: string;
  readonly status: string;
  readonly attempt?: number;
  readonly output?: Json;
  readonly error?: RunError | null;
  readonly waiting_for?: string | null;
  readonly [field: string]: unknown;
}

/** A run as `GET /v1/runs/{id}` returns it; `output` typed by the workflow when known. */
export interface Run<Output = Json> {
  readonly id: string;
  /** A {@link RunStatus}, or a status added by a newer server. */
  readonly status: RunStatus | (string & {});
  readonly family_slug: string;
  readonly version?: number | null;
  readonly input?: Json;
  readonly output: Output | null;
  readonly error: RunError | null;
  readonly steps: readonly RunStep[];
  readonly [field: string]: unknown;
}

/** A run an event's trigger matched but did not start, and why: `code`
 * `run.input_invalid` when the event's data does not satisfy the workflow's
 * `input_schema`, each problem pointing into the event (`/data/total`). */
export interface RefusedRun {
  readonly family_slug: string;
  readonly version: number;
  readonly code: string;
  readonly problems: readonly { readonly pointer: string; readonly message: string }[];
}

/** The answer to `POST /v1/events`. */
export interface EventAccepted {
  readonly id: string;
  readonly name: string;
  readonly duplicate: boolean;
  /** Runs the event started through triggers. */
  readonly runs_started: readonly string[];
  /** Runs waiting for it that it reached. */
  readonly runs_notified: readonly string[];
  /** Runs its triggers matched but did not start. */
  readonly runs_refused: readonly RefusedRun[];
}

/** The answer to `POST /v1/runs/{id}/signals/{name}`. */
export interface SignalAccepted {
  readonly run_id: string;
  readonly signal_id: string;
  readonly name: string;
  readonly duplicate: boolean;
}

/** Options of {@link ApiClient}. */
export interface ApiClientOptions {
  /** The server, e.g. `http://127.0.0.1:7070`. */
  readonly baseUrl?: string | undefined;
  /** Sent as `Authorization: Bearer <apiKey>`. */
  readonly apiKey?: string | null | undefined;
  /** Per-request timeout in milliseconds (default 30 s). */
  readonly timeoutMs?: number | undefined;
  /** The `fetch` to use; injectable for tests. */
  readonly fetch?: typeof fetch | undefined;
}

/** The family slug of an SDK workflow: `bridge:<app>:<workflow>`. */
export function bridgeSlug(target: WorkflowTarget<unknown, unknown>): string {
  return `bridge:${target.appId}:${target.id}`;
}

/** Seconds one request of `waitForResult` asks the server to hold it (a long poll). */
export const LONG_POLL_SECONDS = 30;

/** Client of the Ductor REST API. */
export class ApiClient {
  readonly baseUrl: string;
  readonly #apiKey: string | null;
  readonly #timeoutMs: number;
  readonly #fetch: typeof fetch;

  constructor(options: ApiClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? DEFAULT_BASE_URL).replace(/\/+$/, "");
    this.#apiKey = options.apiKey ?? null;
    this.#timeoutMs = options.timeoutMs ?? 30_000;
    this.#fetch = options.fetch ?? fetch;
  }

  /**
   * Start a run: of an SDK workflow (its input typed), or of a family slug
   * (latest version unless `version`). The `idempotencyKey` dedupes repeats.
   */
  trigger<Input, Output>(
    workflow: WorkflowTarget<Input, Output>,
    input: Input,
    options?: { readonly idempotencyKey?: string },
  ): Promise<Run<Jsonify<Output>>>;
  trigger<Output = Json>(
    familySlug: string,
    input?: unknown,
    options?: { readonly version?: number; readonly idempotencyKey?: string },
  ): Promise<Run<Output>>;
  async trigger(
    workflow: string | WorkflowTarget<unknown, unknown>,
    input?: unknown,
    options: { readonly version?: number; readonly idempotencyKey?: string } = {},
  ): Promise<Run> {
    const body: Record<string, Json> = {
      family_slug: typeof workflow === "string" ? workflow : bridgeSlug(workflow),
      input: toJson(input),
    };
    if (options.version !== undefined) body["version"] = options.version;
    return (await this.#send("POST", "/v1/runs", { body, idempotencyKey: options.idempotencyKey, fields: RUN })) as unknown as Run;
  }

  /** Read a run: status, output, error and per-step state. */
  async getRun<Output = Json>(runId: string): Promise<Run<Output>> {
    return (await this.#send("GET", runPath(runId), { fields: RUN })) as unknown as Run<Output>;
  }

  /** Send an event; `id` dedupes repeats of the same event. */
  async sendEvent(
    name: string,
    data?: unknown,
    options: { readonly id?: string; readonly idempotencyKey?: string } = {},
  ): Promise<EventAccepted> {
    const body: Record<string, Json> = { name, data: toJson(data) };
    if (options.id !== undefined) body["id"] = options.id;
    const answer = await this.#send("POST", "/v1/events", { body, idempotencyKey: options.idempotencyKey, fields: EVENT_ACCEPTED });
    return answer as unknown as EventAccepted;
  }

  /** Send signal `name` with `payload` to a run; `id` dedupes repeats. */
  async signal(
    runId: string,
    name: string,
    payload?: unknown,
    options: { readonly id?: string; readonly idempotencyKey?: string } = {},
  ): Promise<SignalAccepted> {
    const body: Record<string, Json> = { payload: toJson(payload) };
    if (options.id !== undefined) body["id"] = options.id;
    const path = runPath(runId, `/signals/${encodeURIComponent(name)}`);
    const answer = await this.#send("POST", path, { body, idempotencyKey: options.idempotencyKey, fields: SIGNAL_ACCEPTED });
    return answer as unknown as SignalAccepted;
  }

  /** Cancel a run (and its children); poll until `RUN_STATUS_CANCELLED`. */
  async cancel(runId: string, options: { readonly reason?: string } = {}): Promise<Run> {
    const body = options.reason === undefined ? {} : { reason: options.reason };
    return (await this.#send("POST", runPath(runId, "/cancel"), { body, fields: RUN })) as unknown as Run;
  }

  /**
   * Wait for a run to reach a terminal status and return it. Each request asks
   * the server to answer once the run ends (a long poll, `GET
   * /v1/runs/{id}?wait=`, up to `LONG_POLL_SECONDS` at a time); `intervalMs` is
   * the pause between requests only for a server that answers at once.
   *
   * @throws WaitTimeoutError the run is still going after `timeoutMs` (default 60 s).
   * @throws ApiError a request failed or was answered with an error.
   */
  async waitForResult<Output = Json>(
    runId: string,
    options: { readonly timeoutMs?: number; readonly intervalMs?: number } = {},
  ): Promise<Run<Output>> {
    const { timeoutMs = 60_000, intervalMs = 200 } = options;
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const asked = Date.now();
      const waitMs = Math.min(LONG_POLL_SECONDS * 1000, Math.max(deadline - asked, 1));
      const path = `${runPath(runId)}?wait=${waitMs / 1000}`;
      let run: Run<Output>;
      try {
        run = (await this.#send("GET", path, { heldMs: waitMs, fields: RUN })) as unknown as Run<Output>;
      } catch (err) {
        // The server will not hold the request for now (429 run.wait_limit: too many
        // of the tenant's requests wait): ask again after `intervalMs`, until the deadline.
        if (!(err instanceof ApiError) || err.status !== 429 || Date.now() >= deadline) throw err;
        await new Promise((resolve) => setTimeout(resolve, intervalMs));
        continue;
      }
      if (TERMINAL_STATUSES.has(run.status)) return run;
      if (Date.now() >= deadline) throw new WaitTimeoutError(run, timeoutMs);
      // Answered much sooner than asked, the run not done: a server that does not hold requests.
      if (Date.now() - asked < waitMs / 2) await new Promise((resolve) => setTimeout(resolve, intervalMs));
    }
  }

  /**
   * One request; `heldMs` more than the client's timeout for an answer the
   * server holds; a successful answer must be an object whose `fields` are
   * what they must be.
   */
  async #send(
    method: string,
    path: string,
    options: {
      readonly body?: Json;
      readonly idempotencyKey?: string | undefined;
      readonly heldMs?: number;
      readonly fields: Readonly<Record<string, Field>>;
    },
  ): Promise<Json> {
    const { body, idempotencyKey, heldMs = 0, fields } = options;
    const headers: Record<string, string> = { accept: "application/json" };
    if (this.#apiKey) headers["authorization"] = `Bearer ${this.#apiKey}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    if (idempotencyKey !== undefined) headers["idempotency-key"] = idempotencyKey;
    let response: Response;
    let text: string;
    try {
      response = await this.#fetch(this.baseUrl + path, {
        method,
        headers,
        ...(body === undefined ? {} : { body: stringifyJson(body) }),
        signal: AbortSignal.timeout(this.#timeoutMs + heldMs),
      });
      text = await response.text();
    } catch (err) {
      throw new ApiError(`${method} ${path} failed: ${String(err)}`, {
        status: 0,
        code: "api.unreachable",
        retryable: true,
        cause: err,
      });
    }
    const retryable = response.status >= 500 || response.status === 429;
    let value: Json;
    try {
      value = text === "" ? null : parseJson(text);
    } catch {
      throw new ApiError(`${method} ${path} answered ${response.status}: ${text.slice(0, 200)}`, {
        status: response.status,
        code: response.status >= 400 ? "api.error" : "api.bad_response",
        retryable,
      });
    }
    if (response.status >= 400) {
      const error = (value ?? {}) as { code?: Json; message?: Json; details?: Json };
      throw new ApiError(
        typeof error.message === "string" && error.message ? error.message : `${method} ${path} answered ${response.status}`,
        {
          status: response.status,
          code: typeof error.code === "string" ? error.code : "api.error",
          details: error.details ?? null,
          retryable,
        },
      );
    }
    return checked(method, path, response.status, value, fields);
  }
}

/** What one field of an answer must be: a check and its description. */
type Field = readonly [check: (value: Json | undefined) => boolean, what: string];

const isString = (v: Json | undefined): boolean => typeof v === "string";
const isObject = (v: Json | undefined): v is { readonly [key: string]: Json } =>
  typeof v === "object" && v !== null && !Array.isArray(v);
const STRING: Field = [isString, "a string"];
const OPTIONAL_STRING: Field = [(v) => v === undefined || v === null || isString(v), "a string or null"];
const OPTIONAL_INTEGER: Field = [
  (v) => v === undefined || v === null || typeof v === "bigint" || Number.isInteger(v),
  "an integer or null",
];
const OPTIONAL_BOOLEAN: Field = [(v) => v === undefined || typeof v === "boolean", "a boolean"];
const STRINGS: Field = [(v) => v === undefined || (Array.isArray(v) && v.every(isString)), "a list of strings"];
const REFUSED_RUNS: Field = [
  (v) =>
    v === undefined ||
    (Array.isArray(v) &&
      v.every(
        (r) =>
          isObject(r) &&
          isString(r["family_slug"]) &&
          (typeof r["version"] === "bigint" || Number.isInteger(r["version"])) &&
          isString(r["code"]) &&
          (r["problems"] === undefined || Array.isArray(r["problems"])),
      )),
  "a list of {family_slug, version, code, problems}",
];

const RUN: Readonly<Record<string, Field>> = {
  id: STRING,
  status: STRING,
  family_slug: OPTIONAL_STRING,
  version: OPTIONAL_INTEGER,
};
const EVENT_ACCEPTED: Readonly<Record<string, Field>> = {
  id: OPTIONAL_STRING,
  name: OPTIONAL_STRING,
  duplicate: OPTIONAL_BOOLEAN,
  runs_started: STRINGS,
  runs_notified: STRINGS,
  runs_refused: REFUSED_RUNS,
};
const SIGNAL_ACCEPTED: Readonly<Record<string, Field>> = {
  run_id: OPTIONAL_STRING,
  signal_id: OPTIONAL_STRING,
  name: OPTIONAL_STRING,
  duplicate: OPTIONAL_BOOLEAN,
};

/**
 * `answer` if it is an object whose `fields` are what they must be (others are
 * kept, so a newer server works), as the Python client's structs read it.
 *
 * @throws ApiError `api.bad_response` naming the first field that is not.
 */
function checked(
  method: string,
  path: string,
  status: number,
  answer: Json,
  fields: Readonly<Record<string, Field>>,
): Json {
  const bad = (what: string): ApiError =>
    new ApiError(`${method} ${path}: unexpected answer: ${what}`, { status, code: "api.bad_response" });
  if (!isObject(answer)) throw bad(`expected an object, got ${answer === null ? "null" : Array.isArray(answer) ? "a list" : typeof answer}`);
  for (const [name, [check, what]] of Object.entries(fields)) {
    if (!check(answer[name])) throw bad(`'${name}' must be ${what}`);
  }
  return answer;
}

function runPath(runId: string, suffix = ""): string {
  return `/v1/runs/${encodeURIComponent(runId)}${suffix}`;
}
