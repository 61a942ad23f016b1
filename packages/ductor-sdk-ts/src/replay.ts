/**
 * Memoized replay: the step API user code calls, and the driver of one execute.
 *
 * Turns a run's recorded history plus the workflow function into the opcodes
 * of one execute, with the Python SDK's rules (docs/sdk.md, "Replay, step ids
 * and changed code"). No HTTP here.
 *
 * How JavaScript maps onto those rules: a recorded step's result is handed to
 * the body one per turn of the event loop (the microtask queue drained between
 * two), so every step call is attributed to the recorded step whose result it
 * followed. A call that asks for a step recorded *before* the one it followed
 * means sequential steps were reordered; calls made in the same turn
 * (`Promise.all`) may be recorded in any order, as asyncio tasks may in Python.
 * A step the SDK will not run in this execute simply never settles: the body
 * stays suspended there and is collected.
 */

import { AsyncLocalStorage } from "node:async_hooks";

import { canonicalDuration, type Duration } from "./durations.js";
import {
  DuctorError,
  NonDeterminismError,
  NonRetriableError,
  ProtocolError,
  RetryAfterError,
  StepFailedError,
} from "./errors.js";
import { type Json, type Jsonify, toJson } from "./json.js";
import {
  type ErrorInfo,
  type Event as WireEvent,
  Opcode,
  type OpcodeName,
  type RunFailedOp,
  type StepErrorOp,
  type StepFailedOp,
  type StepRecord,
  type StepRunOp,
  StepKeys,
  encodeText,
  stepId,
} from "./protocol.js";

/** Event-loop turns with no new step call after which discovery is complete. */
export const SETTLE_ROUNDS = 10;

/**
 * Before calling the code changed (a new step while a recorded one was not
 * replayed), wait this long (ms) for a slower parallel branch to reach its
 * steps. JavaScript cannot tell such a branch from sequential code, so the
 * wait applies to both; it only delays a run that fails anyway.
 */
export const CHANGE_GRACE_MS = 500;

/** An event as a workflow sees it, its `data` typed. */
export interface Event<Data = Json> {
  readonly name: string;
  readonly data: Data;
  readonly id: string | null;
  readonly ts: string | null;
}

/** A signal as a workflow sees it, its `data` typed. */
export interface Signal<Data = Json> {
  readonly name: string;
  readonly data: Data;
}

/** Event names and their data types (`{ "order.shipped": { order_id: number } }`). */
export type EventSchemas = object;

/** The events of an app that declares none: any name, JSON data. */
export type AnyEvents = Record<string, Json>;

/** What an invoke may target: a workflow object, or a reference to one served elsewhere. */
export interface WorkflowTarget<Input, Output> {
  /** The workflow's id on its app. */
  readonly id: string;
  /** The app serving it. */
  readonly appId: string;
  /** Type-only: the input the workflow takes. */
  readonly __input?: (input: Input) => void;
  /** Type-only: the output it returns. */
  readonly __output?: Output;
}

/** Options of {@link Steps.waitForEvent}. */
export interface WaitForEventOptions<Name extends string> {
  /** The event's name. */
  readonly event: Name;
  /** How long to wait before giving up (the step then returns null). */
  readonly timeout: Duration;
  /** A CEL condition over `event` (the candidate) and `input` (the run's input). */
  readonly match?: string;
}

/** Options of {@link Steps.waitForSignal}. */
export interface WaitForSignalOptions {
  /** How long to wait before giving up (the step then returns null). */
  readonly timeout: Duration;
  /** The signal's name (default: the step's name). */
  readonly signal?: string;
}

/** Options of {@link Steps.invoke} for a workflow object or reference. */
export interface InvokeWorkflowOptions<Input, Output> {
  /** The workflow to run (its app is the target's `appId`). */
  readonly workflow: WorkflowTarget<Input, Output>;
  /** The child's input. */
  readonly input: Input;
  /** Fail the child after this long. */
  readonly timeout?: Duration;
}

/** Options of {@link Steps.invoke} by name. */
export interface InvokeByNameOptions {
  /** A DAG family slug, or with `appId` an SDK workflow's id. */
  readonly workflow: string;
  /** The app serving `workflow` when it is SDK-hosted (any language). */
  readonly appId?: string;
  /** The child's input (JSON-encodable). */
  readonly input?: unknown;
  /** Pin a DAG family version (default: latest). */
  readonly version?: number;
  /** Fail the child after this long. */
  readonly timeout?: Duration;
}

/**
 * The step API of a workflow body: `ctx.step.run(...)`, `ctx.step.sleep(...)`, ...
 *
 * Every method takes a step `name`, unique in the run (repeats are numbered),
 * which identifies the step across replays.
 */
export interface Steps<Events extends EventSchemas = AnyEvents> {
  /**
   * Run `fn` once per run and memoize its JSON result; on replay the recorded
   * result is returned without calling `fn`. The first execution returns the
   * same JSON form (a `Date` comes back as its ISO string).
   *
   * @throws StepFailedError the step failed for good (recorded), on every replay.
   */
  run<T>(name: string, fn: () => T | Promise<T>): Promise<Jsonify<Awaited<T>>>;
  /** Sleep durably for `duration` (`"10m"`, `"1h30m"`, or milliseconds). */
  sleep(name: string, duration: Duration): Promise<void>;
  /** Sleep durably until `until` (a `Date`, or an ISO-8601 string with a zone). */
  sleepUntil(name: string, until: Date | string): Promise<void>;
  /** Wait for an event named `options.event`; null when `options.timeout` passed first. */
  waitForEvent<Name extends keyof Events & string>(
    name: string,
    options: WaitForEventOptions<Name>,
  ): Promise<Event<Jsonify<Events[Name]>> | null>;
  /** Wait for a signal sent to this run; null when `options.timeout` passed first. */
  waitForSignal<Data = Json>(name: string, options: WaitForSignalOptions): Promise<Signal<Data> | null>;
  /**
   * Run another workflow and return its output.
   *
   * @throws StepFailedError the child run failed (or timed out).
   */
  invoke<Input, Output>(
    name: string,
    options: InvokeWorkflowOptions<Input, Output>,
  ): Promise<Jsonify<Awaited<Output>>>;
  invoke<Output = Json>(name: string, options: InvokeByNameOptions): Promise<Output>;
}

/** What a workflow body gets besides its input: the run and the step API. */
export interface Context<Events extends EventSchemas = AnyEvents> {
  /** The run being advanced. */
  readonly runId: string;
  /** The workflow's id. */
  readonly workflowId: string;
  /** Failed attempts so far of what this execute runs (0 first). */
  readonly attempt: number;
  /** The event that triggered the run, if any. */
  readonly event: Event | null;
  /** The engine's W3C trace context, to continue its trace. */
  readonly traceparent: string | null;
  /** The step API. */
  readonly step: Steps<Events>;
}

// ---------------------------------------------------------------- the replay state

interface StepKind {
  readonly label: string;
  readonly ops: readonly OpcodeName[];
}

const RUN: StepKind = { label: "step.run", ops: ["STEP_RUN", "STEP_FAILED"] };
const SLEEP: StepKind = { label: "step.sleep", ops: ["SLEEP"] };
const EVENT: StepKind = { label: "step.waitForEvent", ops: ["WAIT_FOR_EVENT"] };
const SIGNAL: StepKind = { label: "step.waitForSignal", ops: ["WAIT_FOR_SIGNAL"] };
const INVOKE: StepKind = { label: "step.invoke", ops: ["INVOKE"] };

/** A step the code asked for that has no recorded result yet. */
interface Pending {
  readonly id: string;
  readonly name: string;
  readonly kind: StepKind;
  readonly op: Opcode;
  readonly fn: (() => unknown) | undefined;
}

/** A recorded result waiting to be handed to the body. */
interface Delivery {
  readonly record: StepRecord;
  /** The latest recorded position along the chain of steps that led here. */
  readonly horizon: number;
  readonly resolve: (value: Json) => void;
  readonly reject: (error: unknown) => void;
}

const never = new Promise<never>(() => undefined);

function drain(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

class Replay {
  readonly records = new Map<string, { index: number; record: StepRecord }>();
  readonly visited = new Set<string>();
  readonly keys = new StepKeys();
  readonly pending: Pending[] = [];
  readonly deliveries: Delivery[] = [];
  error: NonDeterminismError | null = null;
  calls = 0;
  closed = false;
  done = false;
  /** The horizon of the turn now running (-1: the body's first run, or no delivery). */
  horizon = -1;
  private wakeUp: (() => void) | null = null;

  constructor(steps: readonly StepRecord[]) {
    steps.forEach((record, index) => {
      if (!this.records.has(record.id)) this.records.set(record.id, { index, record });
    });
  }

  wake(): void {
    const wakeUp = this.wakeUp;
    this.wakeUp = null;
    wakeUp?.();
  }

  /** Resolves at the next step call or the body's end. */
  woken(): Promise<void> {
    return new Promise((resolve) => (this.wakeUp = resolve));
  }

  changed(message: string, step: string): Promise<never> {
    this.error ??= new NonDeterminismError(message, step);
    this.wake();
    return never;
  }

  step(name: string, kind: StepKind, makeOp: (id: string) => Opcode, fn?: () => unknown): Promise<Json> {
    if (typeof name !== "string" || name === "") {
      throw new TypeError(`${kind.label} needs a non-empty step name, got ${JSON.stringify(name)}`);
    }
    const outer = runningStep.getStore();
    if (outer !== undefined) {
      // It would wait for the step it runs in, which ends only once it has: forever.
      const nested = Promise.reject(
        new NonRetriableError(
          `${kind.label}('${name}') was called inside step '${outer}': steps cannot be nested; call it from the workflow body`,
          { code: "step.nested" },
        ),
      );
      nested.catch(() => undefined); // a step the function never awaits must not crash the process
      return nested;
    }
    this.calls += 1;
    if (this.closed || this.error !== null) return never;
    const id = stepId(this.keys.key(name));
    const found = this.records.get(id);
    if (found !== undefined) {
      const { index, record } = found;
      if (!kind.ops.includes(record.op)) {
        return this.changed(
          `workflow changed under a running run: step '${name}' was recorded as ${record.op} but the code now calls ${kind.label}`,
          name,
        );
      }
      if (index < this.horizon) {
        return this.changed(
          `workflow changed under a running run: step '${name}' was recorded before a step this code already replayed; steps were reordered`,
          name,
        );
      }
      this.visited.add(id);
      const promise = new Promise<Json>((resolve, reject) => {
        this.deliveries.push({ record, horizon: index, resolve, reject });
      });
      promise.catch(() => undefined); // a step the body never awaits must not crash the process
      this.wake();
      return promise;
    }
    const op = makeOp(id);
    try {
      encodeText(Opcode, op); // options of the wrong type (from untyped code) are the body's error, not a bad answer
    } catch (err) {
      throw new TypeError(`${kind.label}('${name}'): ${err instanceof Error ? err.message : String(err)}`);
    }
    this.pending.push({ id, name, kind, op, fn });
    this.wake();
    return never;
  }

  /** Hand the next recorded result to the body and let it run until it waits again. */
  async deliver(): Promise<void> {
    const delivery = this.deliveries.shift();
    if (delivery === undefined) return;
    this.horizon = delivery.horizon;
    const { record } = delivery;
    if (record.error !== null) delivery.reject(new StepFailedError(record.name, record.error));
    else delivery.resolve(record.result);
    await drain();
    this.horizon = -1;
  }

  /** The first recorded step the code has not asked for, if any. */
  unvisited(): StepRecord | null {
    let first: { index: number; record: StepRecord } | null = null;
    for (const [id, entry] of this.records) {
      if (!this.visited.has(id) && (first === null || entry.index < first.index)) first = entry;
    }
    return first?.record ?? null;
  }

  /** Run until the body ended, or found new steps and stopped finding more. */
  async settle(): Promise<void> {
    for (;;) {
      if (this.error !== null || this.done) return;
      if (this.deliveries.length > 0) {
        await this.deliver();
        continue;
      }
      if (this.pending.length === 0) {
        await this.woken();
        continue;
      }
      let quiet = 0;
      let seen = this.calls;
      while (quiet < SETTLE_ROUNDS && !this.done && this.error === null && this.deliveries.length === 0) {
        await drain();
        if (this.calls === seen) quiet += 1;
        else [quiet, seen] = [0, this.calls];
      }
      if (this.deliveries.length === 0 || this.done || this.error !== null) return;
    }
  }

  /** Whether the body calls another step (or ends) within `ms`. */
  async progressWithin(ms: number): Promise<boolean> {
    const calls = this.calls;
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.woken(), new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
    clearTimeout(timer);
    return this.calls !== calls && !this.done;
  }
}

// ---------------------------------------------------------------- the step API

class StepApi implements Steps {
  readonly #replay: Replay;

  constructor(replay: Replay) {
    this.#replay = replay;
  }

  run<T>(name: string, fn: () => T | Promise<T>): Promise<Jsonify<Awaited<T>>> {
    if (typeof fn !== "function") throw new TypeError(`step.run('${name}') needs a function`);
    return this.#replay.step(name, RUN, (id) => ({ op: "STEP_PLANNED", id, name }), fn) as Promise<
      Jsonify<Awaited<T>>
    >;
  }

  async sleep(name: string, duration: Duration): Promise<void> {
    const text = canonicalDuration(duration);
    await this.#replay.step(name, SLEEP, (id) => ({ op: "SLEEP", id, name, duration: text, until: null }));
  }

  async sleepUntil(name: string, until: Date | string): Promise<void> {
    const text = isoUtc(name, until);
    await this.#replay.step(name, SLEEP, (id) => ({ op: "SLEEP", id, name, duration: null, until: text }));
  }

  async waitForEvent(name: string, options: WaitForEventOptions<string>): Promise<Event | null> {
    const { event, match = null } = options;
    const timeout = canonicalDuration(options.timeout);
    const result = await this.#replay.step(name, EVENT, (id) => ({
      op: "WAIT_FOR_EVENT",
      id,
      name,
      event,
      match,
      timeout,
    }));
    return result === null ? null : asEvent(result);
  }

  async waitForSignal<Data = Json>(name: string, options: WaitForSignalOptions): Promise<Signal<Data> | null> {
    const timeout = canonicalDuration(options.timeout);
    const signal = options.signal || name;
    const result = await this.#replay.step(name, SIGNAL, (id) => ({ op: "WAIT_FOR_SIGNAL", id, name, signal, timeout }));
    return result === null ? null : (asSignal(result) as Signal<Data>);
  }

  invoke(
    name: string,
    options: InvokeByNameOptions | InvokeWorkflowOptions<unknown, unknown>,
  ): Promise<never> {
    let workflow: string;
    let appId: string | null;
    let version: number | null = null;
    if (typeof options.workflow === "string") {
      const byName = options as InvokeByNameOptions;
      workflow = byName.workflow;
      appId = byName.appId ?? null;
      version = byName.version ?? null;
    } else {
      workflow = options.workflow.id;
      appId = options.workflow.appId;
    }
    const input = toJson(options.input);
    const timeout = options.timeout === undefined ? null : canonicalDuration(options.timeout);
    return this.#replay.step(name, INVOKE, (id) => ({
      op: "INVOKE",
      id,
      name,
      workflow,
      app_id: appId,
      input,
      version,
      timeout,
    })) as Promise<never>;
  }
}

function isoUtc(name: string, until: Date | string): string {
  const date = typeof until === "string" ? new Date(until) : until;
  if (typeof until === "string" && !/(?:[zZ]|[+-]\d\d:?\d\d)$/.test(until)) {
    throw new RangeError(`sleepUntil('${name}') needs a time with a zone (Z or ±hh:mm), got '${until}'`);
  }
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new RangeError(`sleepUntil('${name}') needs a valid time`);
  }
  // As Python's isoformat(): seconds, with microseconds only when there are any.
  const iso = date.toISOString();
  return date.getUTCMilliseconds() === 0 ? iso.replace(".000Z", "Z") : iso.replace(/(\.\d{3})Z$/, "$1000Z");
}

function asEvent(value: Json): Event {
  const record = (value ?? {}) as Partial<WireEvent>;
  return { name: record.name ?? "", data: record.data ?? null, id: record.id ?? null, ts: record.ts ?? null };
}

function asSignal(value: Json): Signal {
  const record = (value ?? {}) as Partial<Signal>;
  return { name: record.name ?? "", data: record.data ?? null };
}

// ---------------------------------------------------------------- running one execute

/** Everything one execute needs besides the workflow function. */
export interface ExecuteParams {
  readonly runId: string;
  readonly workflowId: string;
  readonly attempt: number;
  readonly input: Json;
  readonly steps: readonly StepRecord[];
  readonly event: WireEvent | null;
  readonly targetStep: string | null;
  readonly retries: number;
  readonly traceparent: string | null;
}

/** A workflow body as the driver calls it. */
export type Body = (ctx: Context, input: Json) => unknown;

/**
 * Replay `fn` over the recorded steps and return the opcodes of this execute:
 * one step run (`STEP_RUN` / `STEP_ERROR` / `STEP_FAILED`), the steps it waits
 * on (`STEP_PLANNED`, `SLEEP`, `WAIT_FOR_*`, `INVOKE`), or the run's end.
 *
 * @throws ProtocolError `step.target_not_found` when `targetStep` is not a
 *   runnable step found in this execute.
 */
export async function executeWorkflow(fn: Body, params: ExecuteParams): Promise<Opcode[]> {
  const replay = new Replay(params.steps);
  const ctx: Context = {
    runId: params.runId,
    workflowId: params.workflowId,
    attempt: params.attempt,
    event: params.event,
    traceparent: params.traceparent,
    step: new StepApi(replay),
  };
  let outcome: { ok: true; value: unknown } | { ok: false; error: unknown } | null = null;
  // The body runs outside any step, even when this execute runs inside one (a
  // step that runs another workflow in-process).
  const body = runningStep.exit(() => Promise.resolve().then(() => fn(ctx, params.input)));
  body.then(
    (value) => {
      outcome = { ok: true, value };
      replay.done = true;
      replay.wake();
    },
    (error: unknown) => {
      outcome = { ok: false, error };
      replay.done = true;
      replay.wake();
    },
  );
  try {
    for (;;) {
      await replay.settle();
      if (replay.error !== null) return [changedOp(replay.error)];
      if (replay.pending.length === 0) {
        if (outcome === null) throw new Error("the body ended without an outcome");
        return [finished(replay, outcome, params)];
      }
      const missing = replay.unvisited();
      if (missing !== null && !replay.done && (await replay.progressWithin(CHANGE_GRACE_MS))) {
        continue; // a slower branch is still replaying; look again
      }
      const first = replay.pending[0] as Pending;
      if (missing !== null) {
        return [
          changedOp(
            new NonDeterminismError(
              `workflow changed under a running run: the code asks for new step '${first.name}' before recorded step '${missing.name}'`,
              first.name,
            ),
          ),
        ];
      }
      const chosen = choose(replay.pending, params.targetStep);
      if (chosen === null) return replay.pending.map((p) => p.op);
      return [await runStep(chosen, params.attempt, params.retries)];
    }
  } finally {
    replay.closed = true;
  }
}

function choose(pending: readonly Pending[], target: string | null): Pending | null {
  if (target !== null) {
    const found = pending.find((p) => p.id === target && p.kind === RUN);
    if (found !== undefined) return found;
    const names = pending.map((p) => `'${p.name}'`).join(", ") || "none";
    throw new ProtocolError(
      `target step '${target}' is not a runnable step found in this execute (found: ${names})`,
      { code: "step.target_not_found" },
    );
  }
  const only = pending.length === 1 ? pending[0] : undefined;
  return only !== undefined && only.kind === RUN ? only : null;
}

/** The wire form of an error thrown by user code. */
export function errorInfo(error: unknown, defaultCode: string, retryable: boolean): ErrorInfo {
  if (error instanceof DuctorError) {
    return { code: error.code, message: messageOf(error), name: nameOf(error), retryable, details: detailsOf(error.details) };
  }
  if (error instanceof Error) {
    return { code: defaultCode, message: messageOf(error), name: nameOf(error), retryable, details: null };
  }
  return { code: defaultCode, message: textOf(error), name: null, retryable, details: null };
}

/**
 * The text of any thrown value. Reading it runs user code (`toString`, a
 * `message` getter) that may throw, or overflow the stack on a deep array: the
 * error is then recorded under a text naming what it was, never lost in a 500.
 */
function textOf(value: unknown): string {
  try {
    return String(value);
  } catch (err) {
    return `${typeof value} (its text could not be read: ${nameOf(err) ?? typeof err})`;
  }
}

function messageOf(error: Error): string {
  try {
    const { message } = error;
    return typeof message === "string" ? message : textOf(message);
  } catch (err) {
    return `${nameOf(error) ?? "Error"} (its message could not be read: ${nameOf(err) ?? typeof err})`;
  }
}

function nameOf(error: unknown): string | null {
  try {
    if (!(error instanceof Error)) return null;
    const { name } = error;
    return typeof name === "string" ? name : null;
  } catch {
    return null;
  }
}

function detailsOf(details: unknown): Json {
  try {
    return toJson(details, { replace: true });
  } catch {
    return textOf(details);
  }
}

function retryAfter(error: unknown): string | null {
  if (!(error instanceof RetryAfterError)) return null;
  const { retryAfter: value } = error;
  return typeof value === "number" ? canonicalDuration(Math.max(value, 0)) : canonicalDuration(value);
}

/** The name of the step whose function is running, in that function's async context. */
const runningStep = new AsyncLocalStorage<string>();

/** Whether this failure ends the step (or the run) rather than being retried. */
function isFinal(error: unknown, attempt: number, retries: number): boolean {
  if (error instanceof NonRetriableError || error instanceof StepFailedError || error instanceof NonDeterminismError) {
    return true;
  }
  return attempt >= retries;
}

async function runStep(pending: Pending, attempt: number, retries: number): Promise<StepRunOp | StepErrorOp | StepFailedOp> {
  const { id, name } = pending;
  let value: unknown;
  try {
    value = await runningStep.run(name, pending.fn as () => unknown);
  } catch (error) {
    if (isFinal(error, attempt, retries)) {
      return { op: "STEP_FAILED", id, name, error: errorInfo(error, "step.error", false) };
    }
    return { op: "STEP_ERROR", id, name, error: errorInfo(error, "step.error", true), retry_after: retryAfter(error) };
  }
  try {
    return { op: "STEP_RUN", id, name, result: toJson(value) };
  } catch (error) {
    return {
      op: "STEP_FAILED",
      id,
      name,
      error: {
        code: "step.result_invalid",
        message: `step '${name}' returned a value that is not JSON: ${error instanceof Error ? messageOf(error) : textOf(error)}`,
        name: nameOf(error),
        retryable: false,
        details: null,
      },
    };
  }
}

function changedOp(error: NonDeterminismError): RunFailedOp {
  return {
    op: "RUN_FAILED",
    error: { code: error.code, message: error.message, name: error.name, retryable: false, details: { step: error.step } },
  };
}

function finished(
  replay: Replay,
  outcome: { ok: true; value: unknown } | { ok: false; error: unknown },
  params: ExecuteParams,
): Opcode {
  if (outcome.ok) {
    const missing = replay.unvisited();
    if (missing !== null) {
      return changedOp(
        new NonDeterminismError(
          `workflow changed under a running run: recorded step '${missing.name}' is no longer asked for by the code`,
          missing.name,
        ),
      );
    }
    try {
      return { op: "RUN_COMPLETE", output: toJson(outcome.value) };
    } catch (error) {
      return {
        op: "RUN_FAILED",
        error: {
          code: "workflow.output_invalid",
          message: `the workflow returned a value that is not JSON: ${error instanceof Error ? messageOf(error) : textOf(error)}`,
          name: nameOf(error),
          retryable: false,
          details: null,
        },
      };
    }
  }
  const { error } = outcome;
  if (isFinal(error, params.attempt, params.retries)) {
    return { op: "RUN_FAILED", error: errorInfo(error, "workflow.error", false) };
  }
  return { op: "RUN_ERROR", error: errorInfo(error, "workflow.error", true), retry_after: retryAfter(error) };
}
