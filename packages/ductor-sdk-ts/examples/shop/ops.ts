/**
 * Operating the shop through the typed REST client (`@ductor/sdk/api`):
 *
 *     node build/examples/shop/ops.js trigger '{"id": 7, "total": 500}'   # prints the run id
 *     node build/examples/shop/ops.js event ts.order.shipped '{"order_id": 7, "carrier": "ups"}'
 *     node build/examples/shop/ops.js signal RUN_ID approve '"ops"'
 *     node build/examples/shop/ops.js wait RUN_ID                          # prints the run as JSON
 *
 * Uses DUCTOR_URL and DUCTOR_API_KEY.
 */

import { ApiClient } from "@ductor/sdk/api";

import { type Order, fulfil } from "./workflows.js";

const api = new ApiClient({ baseUrl: process.env["DUCTOR_URL"], apiKey: process.env["DUCTOR_API_KEY"] ?? null });
const [command, ...args] = process.argv.slice(2);
const json = (text: string | undefined): unknown => JSON.parse(text ?? "null");

async function main(): Promise<void> {
  switch (command) {
    case "trigger": {
      const run = await api.trigger(fulfil, json(args[0]) as Order, { idempotencyKey: args[1] ?? `order-${Date.now()}` });
      console.log(run.id);
      return;
    }
    case "event": {
      const accepted = await api.sendEvent(args[0] ?? "", json(args[1]));
      console.log(JSON.stringify(accepted));
      return;
    }
    case "signal": {
      const accepted = await api.signal(args[0] ?? "", args[1] ?? "", json(args[2]));
      console.log(JSON.stringify(accepted));
      return;
    }
    case "wait": {
      const run = await api.waitForResult<typeof fulfil extends { __output?: infer O } ? O : never>(args[0] ?? "", {
        timeoutMs: 120_000,
      });
      console.log(JSON.stringify(run));
      return;
    }
    default:
      throw new Error(`unknown command ${String(command)}; use trigger, event, signal or wait`);
  }
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
