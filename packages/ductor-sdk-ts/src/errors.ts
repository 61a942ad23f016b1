/**
 * The SDK's errors: one base with a stable `code` and `retryable`, as in the
 * Python SDK (`ductor.errors`), with the same codes and meanings.
 *
 *     DuctorError                  base: stable `code`, `message`, `retryable`, `details`
 *      ├── NonRetriableError       thrown by user code: fail now, do not retry
 *      ├── RetryAfterError         thrown by user code: retry, not before `retryAfter`
 *      ├── StepFailedError         a step that failed for good, replayed from history
 *      ├── NonDeterminismError     the workflow's code changed under a running run
 *      ├── SignatureError          a bridge message whose signature does not verify
 *      ├── ProtocolError           a bridge message that does not decode or make sense
 *      ├── WorkflowNotFoundError   an execute/cancel for a workflow this app does not serve
 *      ├── DurationError           a duration string that does not parse
 *      ├── ApiError                an error answer from the Ductor REST API (with `status`)
 *      └── WaitTimeoutError        `ApiClient.waitForResult` gave up on a run still going
 *
 * Nothing here does I/O.
 */

import type { Run } from "./api.js";
import { canonicalDuration, type Duration } from "./durations.js";

/** Options every SDK error takes besides its message. */
export interface ErrorOptions {
  /** The stable error code (`"card.declined"`); each class has a default. */
  readonly code?: string;
  /** Whether trying again may succeed; each class has a default. */
  readonly retryable?: boolean;
  /** JSON details carried on the wire with the error. */
  readonly details?: unknown;
  /** The error that caused this one. */
  readonly cause?: unknown;
}

/** Base of every SDK error: a stable `code`, a message and `retryable`. */
export class DuctorError extends Error {
  /** The default code of this class. */
  static readonly code: string = "ductor.error";
  /** The default `retryable` of this class. */
  static readonly retryable: boolean = false;

  /** The stable error code. */
  readonly code: string;
  /** Whether trying again may succeed. */
  readonly retryable: boolean;
  /** JSON details carried on the wire with the error. */
  readonly details: unknown;

  constructor(message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const cls = new.target as unknown as { code: string; retryable: boolean; name: string };
    this.name = cls.name;
    this.code = options.code ?? cls.code;
    this.retryable = options.retryable ?? cls.retryable;
    this.details = options.details ?? null;
  }
}

/** Throw from a step or a workflow body to fail it at once, without retries. */
export class NonRetriableError extends DuctorError {
  static override readonly code: string = "step.non_retriable";
}

/** Options of {@link RetryAfterError}. */
export interface RetryAfterOptions extends ErrorOptions {
  /** The least time to wait before the next attempt: `"30s"`, or milliseconds. */
  readonly retryAfter: Duration;
}

/** Throw from a step or a workflow body to ask for a retry after a delay. */
export class RetryAfterError extends DuctorError {
  static override readonly code: string = "step.retry_after";
  static override readonly retryable: boolean = true;
  /** The least time to wait before the next attempt, as given. */
  readonly retryAfter: Duration;

  /** @throws DurationError `retryAfter` is not a duration (checked here, where it was written). */
  constructor(message: string, options: RetryAfterOptions) {
    super(message, { ...options, retryable: true });
    const { retryAfter } = options;
    canonicalDuration(typeof retryAfter === "number" ? Math.max(retryAfter, 0) : retryAfter);
    this.retryAfter = retryAfter;
  }
}

/**
 * A step failed for good (its retries are spent or it was non-retriable).
 *
 * Thrown where the workflow awaits that step, on every replay, so user code
 * can catch it and compensate. `step` is the step's name; `code` and
 * `errorMessage` are those of the recorded error.
 */
export class StepFailedError extends DuctorError {
  static override readonly code: string = "step.failed";
  /** The step's name. */
  readonly step: string;
  /** The recorded error's own message. */
  readonly errorMessage: string;

  constructor(step: string, error: { code: string; message: string; details?: unknown }) {
    super(`step '${step}' failed: ${error.message}`, {
      code: error.code,
      details: error.details ?? null,
    });
    this.step = step;
    this.errorMessage = error.message;
  }
}

/**
 * The workflow asked for steps that do not match the run's recorded history:
 * its code changed under a running run. The run fails (`workflow.changed`)
 * rather than mis-replaying.
 */
export class NonDeterminismError extends DuctorError {
  static override readonly code: string = "workflow.changed";
  /** The step the change was noticed at. */
  readonly step: string;

  constructor(message: string, step: string) {
    super(message);
    this.step = step;
  }
}

/** A bridge message whose `Ductor-Signature` is missing, malformed, stale or wrong. */
export class SignatureError extends DuctorError {
  static override readonly code: string = "signature.invalid";
}

/** A bridge message that does not decode, or asks for something impossible. */
export class ProtocolError extends DuctorError {
  static override readonly code: string = "protocol.invalid";
}

/** The engine asked for a workflow id this app does not serve. */
export class WorkflowNotFoundError extends DuctorError {
  static override readonly code: string = "workflow.not_found";
}

/** A duration such as `"2s"` or `"1h30m"` that does not parse. */
export class DurationError extends DuctorError {
  static override readonly code: string = "duration.invalid";
}

/** An error answer from the Ductor REST API (or a failed call to it). */
export class ApiError extends DuctorError {
  static override readonly code: string = "api.error";
  /** The HTTP status code (0 when the server could not be reached). */
  readonly status: number;

  constructor(message: string, options: ErrorOptions & { readonly status: number }) {
    super(message, options);
    this.status = options.status;
  }
}

/**
 * `ApiClient.waitForResult` gave up: the run had not reached a terminal status
 * after `timeoutMs`. The run goes on, so waiting again may see it end
 * (`retryable`); `run` is the run as last read.
 */
export class WaitTimeoutError extends DuctorError {
  static override readonly code: string = "run.wait_timeout";
  static override readonly retryable: boolean = true;
  /** The run waited for. */
  readonly runId: string;
  /** How long the caller waited, in milliseconds. */
  readonly timeoutMs: number;
  /** The run as last read, still going. */
  readonly run: Run<unknown>;

  constructor(run: Run<unknown>, timeoutMs: number) {
    super(`run '${run.id}' still ${run.status} after ${timeoutMs}ms`, {
      details: { run_id: run.id, status: run.status, timeout_ms: timeoutMs },
    });
    this.runId = run.id;
    this.timeoutMs = timeoutMs;
    this.run = run;
  }
}
