// examples/docs/protocol.ts
import assert from "node:assert/strict";

import { Ductor } from "@ductor/sdk";
import {
  ExecuteRequest,
  ExecuteResponse,
  SIGNATURE_HEADER,
  SigningKeys,
  decode,
  encode,
  stepId,
  stepRecord,
} from "@ductor/sdk/protocol";

const app = new Ductor({ appId: "billing", signingKey: "signkey-shared-0001" });
app.workflow({ id: "hello" }, async (ctx, name: string) => ctx.step.run("greet", () => `hello ${name}`));

const keys = new SigningKeys("signkey-shared-0001"); // the engine holds the app's key too
const now = () => Math.floor(Date.now() / 1000);
const body = encode(ExecuteRequest, { action: "execute", run_id: "run-1", workflow_id: "hello", input: "ada" });
const headers = { [SIGNATURE_HEADER]: keys.requestHeader(body, now()) }; // a fresh nonce
const answer = await app.handle({ method: "POST", headers, body }); // over HTTP in real life
keys.check(answer.body, answer.headers[SIGNATURE_HEADER], now()); // answers are signed too
const replayed = await app.handle({ method: "POST", headers, body }); // the very same request
assert.equal(replayed.status, 401); // signature.replayed: the step did not run twice
const [op] = decode(ExecuteResponse, answer.body).opcodes;
assert.ok(op?.op === "STEP_RUN");
assert.deepEqual(op, { op: "STEP_RUN", id: stepId("greet"), name: "greet", result: "hello ada" });
const history = [stepRecord(op)]; // what the engine stores, then sends back
const next = encode(ExecuteRequest, { action: "execute", run_id: "run-1", workflow_id: "hello", input: "ada", steps: history });
const done = await app.handle({ method: "POST", headers: { [SIGNATURE_HEADER]: keys.requestHeader(next, now()) }, body: next });
assert.deepEqual(decode(ExecuteResponse, done.body).opcodes, [{ op: "RUN_COMPLETE", output: "hello ada" }]);
