// examples/docs/parallel.ts
import assert from "node:assert/strict";

import { Ductor, NonRetriableError, RetryAfterError, StepFailedError } from "@ductor/sdk";
import { runLocal } from "@ductor/sdk/testing";

const ductor = new Ductor({ appId: "fan", signingKey: "k" });

ductor.workflow({ id: "fan-out" }, async (ctx, items: number[]) =>
  Promise.all(items.map((i) => ctx.step.run(`double-${i}`, () => i * 2))),
);

let tries = 0;
ductor.workflow({ id: "payments", retries: 2 }, async (ctx) => {
  await ctx.step.run("call-provider", () => {
    tries += 1;
    if (tries === 1) throw new RetryAfterError("429 from the provider", { retryAfter: "30s" });
    return "ok";
  });
  try {
    await ctx.step.run("charge", () => {
      throw new NonRetriableError("card declined", { code: "card.declined" });
    });
  } catch (err) {
    if (err instanceof StepFailedError) return `compensated after ${err.code}`;
    throw err;
  }
  return "charged";
});

const fanned = await runLocal(ductor, "fan-out", [1, 2, 3]);
assert.deepEqual(fanned.output, [2, 4, 6]);
assert.deepEqual(
  fanned.responses[0]?.map((op) => op.op),
  ["STEP_PLANNED", "STEP_PLANNED", "STEP_PLANNED"], // found together, none run yet
);

const paid = await runLocal(ductor, "payments");
assert.equal(paid.output, "compensated after card.declined");
const [first] = paid.responses[0] ?? [];
assert.equal(first?.op === "STEP_ERROR" && first.retry_after, "30s");
