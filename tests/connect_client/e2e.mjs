// Drives a Ductor server with connect-es, a Connect client not written here, through
// code protoc-gen-es generated from proto/. Prints what it saw as one JSON object;
// tests/test_connect_e2e.py runs it against real server processes and checks it.
//
//   DUCTOR_URL=http://127.0.0.1:7070 DUCTOR_API_KEY=dk_... node e2e.mjs
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { fromJson, toJson } from "@bufbuild/protobuf";
import { StructSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { RoutingService } from "./_gen/ductor/v1/routing_service_pb.js";
import { RunService } from "./_gen/ductor/v1/run_service_pb.js";
import { WorkflowService } from "./_gen/ductor/v1/workflow_service_pb.js";

const url = process.env.DUCTOR_URL;
const key = process.env.DUCTOR_API_KEY;

function transport(apiKey) {
  return createConnectTransport({
    baseUrl: url,
    httpVersion: "1.1",
    useBinaryFormat: false, // Ductor speaks the JSON codec only
    interceptors: [
      (next) => async (request) => {
        request.header.set("Authorization", `Bearer ${apiKey}`);
        return next(request);
      },
    ],
  });
}

const workflows = createClient(WorkflowService, transport(key));
const runs = createClient(RunService, transport(key));
const routing = createClient(RoutingService, transport(key));

async function refusal(call) {
  try {
    await call();
  } catch (error) {
    const refused = ConnectError.from(error);
    const [detail] = refused.findDetails(StructSchema);
    const json = detail ? toJson(StructSchema, detail) : null;
    return { code: Code[refused.code], message: refused.rawMessage, detail: json };
  }
  throw new Error("the call was not refused");
}

// A google.protobuf.Value field (any JSON: definitions, inputs, outputs) from JSON.
const value = (json) => fromJson(ValueSchema, json);

const seen = {};

// Publish a workflow, trigger a run (idempotently), and watch it finish.
const published = await workflows.publishWorkflow({
  definition: value({
    family_slug: "hello",
    title: "Say hello",
    steps: [
      {
        ref: "greet",
        type: "STEP_TYPE_DATAFLOW",
        args: { operation: "project", project: { greeting: "'hello ' + input.name" } },
      },
    ],
    edges: [],
  }),
});
seen.published = { family_slug: published.familySlug, version: Number(published.version) };

const headers = { "Idempotency-Key": "connect-e2e-1" };
const run = await runs.triggerRun({ familySlug: "hello", input: value({ name: "ada" }) }, { headers });
let replayed = null;
const again = await runs.triggerRun(
  { familySlug: "hello", input: value({ name: "ada" }) },
  { headers, onHeader: (h) => (replayed = h.get("Idempotency-Replayed")) },
);
seen.trigger = { id: run.id, status: run.status, again: again.id, replayed };

const deadline = Date.now() + 60_000;
let current = run;
while (!/SUCCEEDED|FAILED|CANCELLED/.test(current.status)) {
  if (Date.now() > deadline) throw new Error(`run ${run.id} did not finish: ${current.status}`);
  await new Promise((resolve) => setTimeout(resolve, 100));
  current = await runs.getRun({ runId: run.id });
}
seen.finished = { status: current.status, output: toJson(ValueSchema, current.output), steps: current.steps.length };
const page = await runs.listRuns({ familySlug: "hello", limit: 10 });
seen.listed = page.items.map((item) => item.id);

// Route a lead: a worker, a pool, the rules, then the routable.
await routing.putWorker({ id: "ana" });
await routing.putPool({ id: "leads", members: [{ worker: "ana" }] });
await routing.publishRules({ kinds: { lead: {} }, defaultPool: "leads" });
const decision = await routing.route({
  id: "lead-1",
  kind: "lead",
  attributes: { state: "CA", score: 91 },
});
const stored = await routing.getDecision({ decisionId: decision.id });
seen.route = { worker: decision.worker, pool: decision.pool, stored: stored.worker };

// Errors: a Connect code, Ductor's code and details in a google.protobuf.Struct.
seen.not_found = await refusal(() => runs.getRun({ runId: "run-that-is-not-there" }));
seen.invalid = await refusal(() => runs.listRuns({ limit: 100000 }));
const stranger = createClient(RunService, transport("dk_not_a_key"));
seen.unauthenticated = await refusal(() => stranger.getRun({ runId: run.id }));

process.stdout.write(JSON.stringify(seen));
