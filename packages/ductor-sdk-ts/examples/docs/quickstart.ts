// examples/docs/quickstart.ts
import assert from "node:assert/strict";

import { Ductor, StepFailedError } from "@ductor/sdk";
import { runLocal } from "@ductor/sdk/testing";

interface Order {
  id: number;
  total: number;
}
interface Events {
  "order.created": Order;
  "order.shipped": { order_id: number; carrier: string };
}

const ductor = new Ductor<Events>({ appId: "billing", signingKey: "signkey-dev-0001" });

function chargeCard(order: Order): Promise<{ chargeId: string; amount: number }> {
  return Promise.resolve({ chargeId: `ch_${order.id}`, amount: order.total });
}

export const chargeOrder = ductor.workflow(
  { id: "charge-order", trigger: "order.created", retries: 3, timeout: "30d" },
  async (ctx, order: Order) => {
    const charge = await ctx.step.run("charge", () => chargeCard(order)); // runs once, memoized
    await ctx.step.sleep("cool-off", "10m"); // a durable timer
    const shipped = await ctx.step.waitForEvent("shipped", {
      event: "order.shipped",
      match: "event.data.order_id == input.id",
      timeout: "7d",
    });
    if (shipped === null) return { charge, carrier: null, receipt: null }; // timed out
    let receipt = null;
    try {
      receipt = await ctx.step.invoke("receipt", { workflow: "send-receipt", input: charge });
    } catch (err) {
      if (!(err instanceof StepFailedError)) throw err; // the child run failed
    }
    return { charge, carrier: shipped.data.carrier, receipt };
  },
);

// runLocal plays the engine's part in-process: handy for unit tests.
const run = await runLocal(ductor, "charge-order", { id: 7, total: 500 }, {
  events: { "order.shipped": { order_id: 7, carrier: "ups" } },
  invoke: () => ({ sent: true }),
});
assert.equal(run.status, "RUN_STATUS_SUCCEEDED");
assert.deepEqual(run.output, {
  charge: { chargeId: "ch_7", amount: 500 },
  carrier: "ups",
  receipt: { sent: true },
});
