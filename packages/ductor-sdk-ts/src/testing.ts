/**
 * Running a workflow in-process, as the engine would, for unit tests: no
 * server, no HTTP. Steps are recorded, planned steps run one by one, waits
 * are resolved by the callbacks given (an event wait matches by name only;
 * CEL `match` is not evaluated), retries happen at once.
 */

import type { Ductor } from "./client.js";
import type { Json } from "./json.js";
import { type InvokeOp, type Opcode, type StepRecord, stepRecord } from "./protocol.js";
import type { AnyEvents, EventSchemas } from "./replay.js";

/** How the waits of a local run resolve (null: the wait timed out). */
export interface LocalWaits {
  /** Event data by event name; a missing name times out. */
  readonly events?: Readonly<Record<string, Json>>;
  /** Signal data by signal name; a missing name times out. */
  readonly signals?: Readonly<Record<string, Json>>;
  /** The output of an invoked workflow. */
  readonly invoke?: (op: InvokeOp) => Json;
}

/** The end of a local run: its last opcode, the history recorded and every execute's answer. */
export interface LocalRun {
  readonly status: "RUN_STATUS_SUCCEEDED" | "RUN_STATUS_FAILED";
  readonly output: Json;
  readonly last: Opcode;
  readonly history: readonly StepRecord[];
  readonly responses: readonly (readonly Opcode[])[];
}

/**
 * Run workflow `workflowId` of `ductor` to its end in this process.
 *
 * @throws Error the run did not end within `maxExecutes` executes.
 */
export async function runLocal<Events extends EventSchemas = AnyEvents>(
  ductor: Ductor<Events>,
  workflowId: string,
  input: Json = null,
  waits: LocalWaits = {},
  maxExecutes = 1000,
): Promise<LocalRun> {
  const history: StepRecord[] = [];
  const responses: Opcode[][] = [];
  let attempt = 0;
  const execute = async (target: string | null): Promise<Opcode[]> => {
    const { opcodes } = await ductor.execute({
      action: "execute",
      run_id: "local-run",
      workflow_id: workflowId,
      attempt,
      input,
      steps: [...history],
      event: null,
      target_step: target,
      payload_ref: null,
      traceparent: null,
    });
    responses.push(opcodes);
    return opcodes;
  };
  const resolve = (op: Opcode): Json => {
    if (op.op === "WAIT_FOR_EVENT") {
      const data = waits.events?.[op.event];
      return data === undefined ? null : { name: op.event, data, id: null, ts: null };
    }
    if (op.op === "WAIT_FOR_SIGNAL") {
      const data = waits.signals?.[op.signal];
      return data === undefined ? null : { name: op.signal, data };
    }
    if (op.op === "INVOKE") return waits.invoke?.(op) ?? null;
    return null;
  };
  while (responses.length < maxExecutes) {
    const opcodes = await execute(null);
    const last = opcodes[opcodes.length - 1] as Opcode;
    if (last.op === "RUN_COMPLETE") return { status: "RUN_STATUS_SUCCEEDED", output: last.output, last, history, responses };
    if (last.op === "RUN_FAILED") return { status: "RUN_STATUS_FAILED", output: null, last, history, responses };
    if (last.op === "STEP_ERROR" || last.op === "RUN_ERROR") {
      attempt += 1;
      continue;
    }
    attempt = 0;
    for (const op of opcodes) {
      if (op.op === "STEP_RUN" || op.op === "STEP_FAILED" || op.op === "SLEEP") {
        history.push(stepRecord(op));
      } else if (op.op === "WAIT_FOR_EVENT" || op.op === "WAIT_FOR_SIGNAL" || op.op === "INVOKE") {
        history.push(stepRecord(op, { result: resolve(op) }));
      } else if (op.op === "STEP_PLANNED") {
        for (;;) {
          const [ran] = await execute(op.id);
          if (ran?.op === "STEP_ERROR") {
            attempt += 1;
            continue;
          }
          if (ran?.op === "STEP_RUN" || ran?.op === "STEP_FAILED") history.push(stepRecord(ran));
          attempt = 0;
          break;
        }
      }
    }
  }
  throw new Error(`workflow '${workflowId}' did not end within ${maxExecutes} executes`);
}
