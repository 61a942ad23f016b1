/**
 * The example shop as a Node process: `node build/examples/shop/app.js`
 * serves the bridge endpoint on 127.0.0.1:$APP_PORT (node:http adapter) and,
 * given DUCTOR_API_KEY, registers with the server once it listens.
 */

import { createBridgeServer } from "@ductor/sdk/node";

import { ductor } from "./workflows.js";

const port = Number(process.env["APP_PORT"] ?? "8020");
const server = createBridgeServer(ductor);

server.listen(port, "127.0.0.1", () => {
  if (!process.env["DUCTOR_API_KEY"]) return;
  ductor.sync().then(
    (ack) => {
      console.log(`synced ${ack.app_id}: ${ack.accepted.join(", ")}`);
    },
    (err: unknown) => {
      console.error("sync failed:", err);
      process.exit(1);
    },
  );
});
