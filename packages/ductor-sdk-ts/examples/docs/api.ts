// examples/docs/api.ts
import { Ductor } from "@ductor/sdk";
import { ApiClient } from "@ductor/sdk/api";

const ductor = new Ductor({ appId: "billing", signingKey: "k" });
const chargeOrder = ductor.workflow({ id: "charge-order" }, async (ctx, order: { id: number }) =>
  ctx.step.run("charge", () => ({ chargeId: `ch_${order.id}` })),
);

export async function triggerAndWait(): Promise<void> {
  // needs a running server
  const api = new ApiClient({ baseUrl: "http://127.0.0.1:7070", apiKey: "…" });
  const run = await api.trigger(chargeOrder, { id: 7 }, { idempotencyKey: "order-7" }); // input typed
  await api.sendEvent("order.shipped", { order_id: 7 }, { id: "evt-7" });
  await api.signal(run.id, "approve", { by: "ops" });
  const done = await api.waitForResult<{ chargeId: string }>(run.id, { timeoutMs: 60_000 });
  console.log(done.status, done.output?.chargeId);
  await api.trigger("send-receipt", { any: "json" }, { version: 3 }); // a DAG family by slug
  await api.cancel(run.id);
}
