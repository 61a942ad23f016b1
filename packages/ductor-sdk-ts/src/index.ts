/**
 * `@ductor/sdk`: host durable workflows in TypeScript application code.
 *
 * Register workflow bodies on a {@link Ductor}, serve its bridge endpoint with
 * an adapter (`@ductor/sdk/node`, `/express`, `/hono`, `/fetch`), and talk to
 * the server's REST API with `@ductor/sdk/api`. The wire protocol, held to
 * the same golden vectors as the Python SDK, is `@ductor/sdk/protocol`.
 */

export {
  type BridgeHost,
  type BridgeRequestInit,
  type BridgeResponse,
  type CancelContext,
  type Concurrency,
  Ductor,
  type DuctorOptions,
  type Trigger,
  Workflow,
  type WorkflowFn,
  type WorkflowOptions,
  workflowRef,
} from "./client.js";
export {
  type Context,
  type Event,
  type AnyEvents,
  type EventSchemas,
  type InvokeByNameOptions,
  type InvokeWorkflowOptions,
  type Signal,
  type Steps,
  type WaitForEventOptions,
  type WaitForSignalOptions,
  type WorkflowTarget,
} from "./replay.js";
export {
  ApiError,
  DuctorError,
  DurationError,
  type ErrorOptions,
  NonDeterminismError,
  NonRetriableError,
  ProtocolError,
  RetryAfterError,
  type RetryAfterOptions,
  SignatureError,
  StepFailedError,
  WaitTimeoutError,
  WorkflowNotFoundError,
} from "./errors.js";
export { type Duration, type DurationString, canonicalDuration, formatDuration, parseDuration } from "./durations.js";
export type { Json, JsonObject, Jsonify } from "./json.js";
export { SDK_NAME, SDK_VERSION } from "./version.js";
