/** A tiny in-process engine for the tests: drives a Ductor app through execute requests. */

import {
  type ExecuteRequest,
  type Opcode,
  type StepRecord,
  stepRecord,
} from "../src/protocol.js";
import type { Ductor, Json } from "../src/index.js";

/** One execute of workflow `workflowId` with `steps` as history. */
export async function execute(
  app: Ductor,
  workflowId: string,
  options: { input?: Json; steps?: StepRecord[]; attempt?: number; target?: string | null } = {},
): Promise<Opcode[]> {
  const request: ExecuteRequest = {
    action: "execute",
    run_id: "run-1",
    workflow_id: workflowId,
    attempt: options.attempt ?? 0,
    input: options.input ?? null,
    steps: options.steps ?? [],
    event: null,
    target_step: options.target ?? null,
    payload_ref: null,
    traceparent: null,
  };
  return (await app.execute(request)).opcodes;
}

/**
 * Run a workflow to its end as the engine would: record steps, run planned
 * steps with `target_step`, resolve waits with `resolve(op)`, retry errors.
 */
export async function runToEnd(
  app: Ductor,
  workflowId: string,
  input: Json = null,
  resolve: (op: Opcode) => Json = () => null,
): Promise<{ last: Opcode; executes: number; history: StepRecord[] }> {
  const history: StepRecord[] = [];
  let attempt = 0;
  for (let executes = 1; executes < 200; executes++) {
    const opcodes = await execute(app, workflowId, { input, steps: history, attempt });
    const last = opcodes[opcodes.length - 1] as Opcode;
    if (last.op === "RUN_COMPLETE" || last.op === "RUN_FAILED") return { last, executes, history };
    if (last.op === "STEP_ERROR" || last.op === "RUN_ERROR") {
      attempt += 1;
      continue;
    }
    attempt = 0;
    for (const op of opcodes) {
      if (op.op === "STEP_RUN" || op.op === "STEP_FAILED" || op.op === "SLEEP") history.push(stepRecord(op));
      else if (op.op === "WAIT_FOR_EVENT" || op.op === "WAIT_FOR_SIGNAL" || op.op === "INVOKE") {
        history.push(stepRecord(op, { result: resolve(op) }));
      } else if (op.op === "STEP_PLANNED") {
        const [ran] = await execute(app, workflowId, { input, steps: history, target: op.id });
        if (ran?.op === "STEP_RUN" || ran?.op === "STEP_FAILED") history.push(stepRecord(ran));
      }
    }
  }
  throw new Error("the run did not end in 200 executes");
}
