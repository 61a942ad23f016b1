/**
 * The bridge endpoint over real HTTP on 127.0.0.1: the node:http adapter,
 * Express (raw body, and the body-parser mistake), Hono through its fetch
 * entry, and the SDK's own signed calls to a server (sync, payload by reference).
 */

import assert from "node:assert/strict";
import { type IncomingMessage, type Server, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import express from "express";
import { Hono } from "hono";

import { Ductor } from "../src/index.js";
import { MAX_BODY_BYTES, createBridgeServer, readBody } from "../src/adapters/node.js";
import { ductorExpress } from "../src/adapters/express.js";
import { ductorHono } from "../src/adapters/hono.js";
import { fetchHandler } from "../src/adapters/fetch.js";
import {
  APP_HEADER,
  DescribeResponse,
  ErrorResponse,
  ExecutePayload,
  ExecuteRequest,
  ExecuteResponse,
  HealthResponse,
  type Input,
  SIGNATURE_HEADER,
  SeenNonces,
  SigningKeys,
  SyncAck,
  SyncResponse,
  decode,
  encode,
  stepId,
  verifySigned,
} from "../src/protocol.js";

const KEY = "adapter-key";
const keys = new SigningKeys(KEY);
const now = () => Math.floor(Date.now() / 1000);

function listen(server: Server): Promise<string> {
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => { resolve(`http://127.0.0.1:${(server.address() as AddressInfo).port}`); });
  });
}

function makeApp(serverUrl = "http://127.0.0.1:9"): { ductor: Ductor; ran: string[] } {
  const ran: string[] = [];
  const ductor = new Ductor({ appId: "shop", signingKey: KEY, serverUrl, apiKey: "api-key-1" });
  ductor.workflow({ id: "greet", trigger: "user.created" }, async (ctx, name: string) =>
    ctx.step.run("greet", () => {
      ran.push(name);
      return `hello ${name}`;
    }),
  );
  return { ductor, ran };
}

async function post(url: string, body: Uint8Array, header?: string): Promise<{ status: number; body: Uint8Array; headers: Headers }> {
  const response = await fetch(url, {
    method: "POST",
    headers: header === undefined ? {} : { [SIGNATURE_HEADER]: header },
    body: body as Uint8Array<ArrayBuffer>,
  });
  const raw = new Uint8Array(await response.arrayBuffer());
  // Every answer is signed, errors included.
  verifySigned(raw, response.headers.get(SIGNATURE_HEADER), { keys: [KEY], now: now() });
  return { status: response.status, body: raw, headers: response.headers };
}

const greet = (input = "ada"): Uint8Array =>
  encode(ExecuteRequest, { action: "execute", run_id: "run-1", workflow_id: "greet", input } satisfies Input<typeof ExecuteRequest>);

describe("node:http", () => {
  const { ductor, ran } = makeApp();
  const server = createBridgeServer(ductor);
  let base = "";
  before(async () => (base = await listen(server)));
  after(() => server.close());

  test("GET is health; a signed execute runs the step; the same request again is refused", async () => {
    const health = await fetch(`${base}/api/ductor`);
    const raw = new Uint8Array(await health.arrayBuffer());
    assert.equal(decode(HealthResponse, raw).sdk, "ductor-typescript");
    const body = greet();
    const header = keys.requestHeader(body, now());
    const answer = await post(`${base}/api/ductor`, body, header);
    assert.equal(answer.status, 200);
    assert.deepEqual(decode(ExecuteResponse, answer.body).opcodes, [
      { op: "STEP_RUN", id: stepId("greet"), name: "greet", result: "hello ada" },
    ]);
    const replayed = await post(`${base}/api/ductor`, body, header);
    assert.deepEqual([replayed.status, decode(ErrorResponse, replayed.body).code], [401, "signature.replayed"]);
    assert.deepEqual(ran, ["ada"]);
  });

  test("bad, missing and v1-only signatures run nothing", async () => {
    const body = greet("eve");
    const forged = new SigningKeys("not-the-key").requestHeader(body, now());
    for (const [header, code] of [
      [forged, "signature.mismatch"],
      [undefined, "signature.missing"],
      [keys.header(body, now()), "signature.nonce_required"],
      [keys.requestHeader(body, now() - 301), "signature.expired"],
      ["t=1," + "v1=zz", "signature.malformed"],
    ] as const) {
      const answer = await post(`${base}/api/ductor`, body, header);
      assert.deepEqual([answer.status, decode(ErrorResponse, answer.body).code], [401, code]);
    }
    assert.ok(!ran.includes("eve"));
  });

  test("malformed bodies are a signed 400; other methods 405; other paths 404; huge bodies 413", async () => {
    for (const text of ["action=health", '{"action":"health","debug":true}', '{"action":"execute","run_id":"r","workflow_id":"w","attempt":2.0}', "[".repeat(10_000)]) {
      const body = new TextEncoder().encode(text);
      const answer = await post(`${base}/api/ductor`, body, keys.requestHeader(body, now()));
      assert.deepEqual([answer.status, decode(ErrorResponse, answer.body).code], [400, "protocol.invalid"]);
    }
    assert.equal((await fetch(`${base}/api/ductor`, { method: "PUT" })).status, 405);
    assert.equal((await fetch(`${base}/elsewhere`)).status, 404);
    const small = createBridgeServer(ductor, { maxBodyBytes: 1000 });
    const smallBase = await listen(small);
    const huge = await fetch(`${smallBase}/api/ductor`, { method: "POST", body: "x".repeat(5000) });
    assert.equal(huge.status, 413);
    small.close();
  });
});

describe("Express", () => {
  const { ductor, ran } = makeApp();
  const appRaw = express();
  appRaw.all("/api/ductor", ductorExpress(ductor));
  const appParsed = express();
  appParsed.use(express.json());
  appParsed.all("/api/ductor", ductorExpress(ductor));
  const appExplicitRaw = express();
  appExplicitRaw.use("/api/ductor", express.raw({ type: "*/*" }));
  appExplicitRaw.all("/api/ductor", ductorExpress(ductor));
  const servers = [createServer(appRaw), createServer(appParsed), createServer(appExplicitRaw)];
  const bases: string[] = [];
  before(async () => {
    for (const server of servers) bases.push(await listen(server));
  });
  after(() => {
    for (const server of servers) server.close();
  });

  test("mounted first, or after express.raw(), it answers; after express.json() it refuses clearly", async () => {
    const [raw = "", parsed = "", explicit = ""] = bases;
    for (const [base, name] of [[raw, "grace"], [explicit, "linus"]] as const) {
      const body = greet(name);
      const answer = await post(`${base}/api/ductor`, body, keys.requestHeader(body, now()));
      assert.equal(answer.status, 200, new TextDecoder().decode(answer.body));
    }
    const body = greet("json");
    const refused = await fetch(`${parsed}/api/ductor`, {
      method: "POST",
      headers: { "content-type": "application/json", [SIGNATURE_HEADER]: keys.requestHeader(body, now()) },
      body: body as Uint8Array<ArrayBuffer>,
    });
    assert.equal(refused.status, 500);
    assert.equal(decode(ErrorResponse, new Uint8Array(await refused.arrayBuffer())).code, "bridge.body_parsed");
    assert.deepEqual(ran, ["grace", "linus"]);
  });
});

describe("Hono and fetch", () => {
  test("a Hono route answers through the fetch adapter", async () => {
    const { ductor, ran } = makeApp();
    const app = new Hono();
    app.on(["GET", "POST"], "/api/ductor", ductorHono(ductor));
    const body = greet("hono");
    const answer = await app.fetch(
      new Request("http://app.local/api/ductor", {
        method: "POST",
        headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now()) },
        body: body as Uint8Array<ArrayBuffer>,
      }),
    );
    assert.equal(answer.status, 200);
    assert.deepEqual(ran, ["hono"]);
    const describeBody = new TextEncoder().encode('{"action":"describe"}');
    const described = await fetchHandler(ductor)(
      new Request("http://app.local/api/ductor", {
        method: "POST",
        headers: { [SIGNATURE_HEADER]: keys.requestHeader(describeBody, now()) },
        body: describeBody,
      }),
    );
    const description = decode(DescribeResponse, new Uint8Array(await described.arrayBuffer()));
    assert.equal(description.url, "http://app.local/api/ductor");
    assert.deepEqual(description.workflows[0]?.triggers, [{ event: "user.created", cron: null, match: null }]);
    const elsewhere = await fetchHandler(ductor, { path: "/api/ductor" })(new Request("http://app.local/other"));
    assert.equal(elsewhere.status, 404);
  });
});

describe("body limits", () => {
  test("every adapter answers a body over maxBodyBytes with a plain 413 before it is verified, and reads one at the limit", async () => {
    assert.equal(MAX_BODY_BYTES, 64 * 1024 * 1024);
    const { ductor } = makeApp();
    const limit = { maxBodyBytes: 1000 };
    const express413 = express();
    express413.all("/api/ductor", ductorExpress(ductor, limit));
    const expressRaw = express();
    expressRaw.use("/api/ductor", express.raw({ type: "*/*" }));
    expressRaw.all("/api/ductor", ductorExpress(ductor, limit));
    const servers = [createBridgeServer(ductor, limit), createServer(express413), createServer(expressRaw)];
    const hono = new Hono();
    hono.on(["GET", "POST"], "/api/ductor", ductorHono(ductor, limit));
    const callers: ((body: string) => Response | Promise<Response>)[] = [
      ...(await Promise.all(servers.map(listen))).map(
        (base) => (body: string) => fetch(`${base}/api/ductor`, { method: "POST", body }),
      ),
      (body) => fetchHandler(ductor, limit)(new Request("http://app.local/api/ductor", { method: "POST", body })),
      (body) => hono.fetch(new Request("http://app.local/api/ductor", { method: "POST", body })),
    ];
    try {
      for (const [i, call] of callers.entries()) {
        const huge = await call("x".repeat(1001));
        assert.equal(huge.status, 413, `adapter ${i}`);
        assert.equal(huge.headers.get("content-type"), "text/plain");
        assert.equal(huge.headers.get(SIGNATURE_HEADER), null);
        assert.equal(await huge.text(), "body too large");
        // At the limit the body is read, then refused as any unsigned request is.
        const read = await call("x".repeat(1000));
        const raw = new Uint8Array(await read.arrayBuffer());
        assert.deepEqual([read.status, decode(ErrorResponse, raw).code], [401, "signature.missing"], `adapter ${i}`);
      }
    } finally {
      for (const server of servers) server.close();
    }
  });
});

describe("signing keys", () => {
  test("a fallback key is accepted and never signs; a full nonce store is a signed, retryable 503", async () => {
    const ductor = new Ductor({
      appId: "shop",
      signingKey: "key-new-0001",
      fallbackSigningKey: "key-old-0001",
      seenNonces: new SeenNonces({ capacity: 2 }),
    });
    ductor.workflow({ id: "greet" }, async (ctx, name: string) => ctx.step.run("greet", () => `hello ${name}`));
    const answers = [];
    for (const key of ["key-old-0001", "key-new-0001", "key-old-0001"]) {
      const body = greet(key);
      const headers = { [SIGNATURE_HEADER]: new SigningKeys(key).requestHeader(body, now()) };
      answers.push(await ductor.handle({ method: "POST", headers, body }));
    }
    assert.deepEqual(answers.map((a) => a.status), [200, 200, 503]);
    const full = decode(ErrorResponse, answers[2]?.body ?? new Uint8Array());
    assert.deepEqual([full.code, full.retryable], ["signature.replay_cache_full", true]);
    for (const answer of answers) {
      const signature = answer.headers[SIGNATURE_HEADER];
      assert.doesNotThrow(() => verifySigned(answer.body, signature, { keys: ["key-new-0001"], now: now() }));
      assert.throws(() => verifySigned(answer.body, signature, { keys: ["key-old-0001"], now: now() }));
    }
  });
});

describe("calls to the server", () => {
  const seen: { method: string; url: string; app: string | undefined; auth: string | undefined }[] = [];
  let serverBase = "";
  const history = [{ id: stepId("greet"), name: "greet", op: "STEP_RUN" as const, result: "hello big", error: null }];
  const fake = createServer((req: IncomingMessage, res) => {
    void readBody(req, 1 << 20).then((body) => {
      const verified = verifySigned(body, req.headers["ductor-signature"] as string, { keys: [KEY], now: now(), requireNonce: true });
      assert.ok(verified.nonce);
      seen.push({ method: req.method ?? "", url: req.url ?? "", app: req.headers["ductor-app"] as string, auth: req.headers.authorization });
      let answer: Uint8Array;
      if (req.url === "/v1/bridge/sync") {
        const described = decode(DescribeResponse, body);
        answer = encode(SyncAck, { app_id: described.app_id, accepted: described.workflows.map((w) => w.id) });
      } else {
        answer = encode(ExecutePayload, { run_id: req.url?.includes("run-9") ? "run-9" : "other", input: "big", steps: history });
      }
      res.writeHead(200, { "content-type": "application/json", [SIGNATURE_HEADER]: keys.header(answer, now()) });
      res.end(answer);
    });
  });
  before(async () => (serverBase = await listen(fake)));
  after(() => fake.close());

  test("sync posts the describe payload, signed, naming the app", async () => {
    const { ductor } = makeApp(serverBase);
    const ack = await ductor.sync("http://app.local/api/ductor");
    assert.deepEqual(ack.accepted, ["greet"]);
    assert.deepEqual(seen.at(-1), { method: "POST", url: "/v1/bridge/sync", app: "shop", auth: "Bearer api-key-1" });
    const body = new TextEncoder().encode('{"action":"sync","url":null}');
    const answer = await ductor.handle({ method: "POST", headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now()) }, body });
    assert.deepEqual(decode(SyncResponse, answer.body), { app_id: "shop", synced: true, accepted: ["greet"] });
  });

  test("an execute by reference fetches its payload; a payload of another run is refused", async () => {
    const { ductor, ran } = makeApp(serverBase);
    const response = await ductor.execute(decode(ExecuteRequest, '{"action":"execute","run_id":"run-9","workflow_id":"greet","payload_ref":"run-9:3"}'));
    assert.deepEqual(response.opcodes, [{ op: "RUN_COMPLETE", output: "hello big" }]);
    assert.deepEqual(ran, []);
    assert.equal(seen.at(-1)?.url, "/v1/bridge/runs/run-9/payload?ref=run-9%3A3");
    const body = new TextEncoder().encode('{"action":"execute","run_id":"run-8","workflow_id":"greet","payload_ref":"x"}');
    const answer = await ductor.handle({ method: "POST", headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now()) }, body });
    assert.deepEqual([answer.status, decode(ErrorResponse, answer.body).code], [502, "payload.run_mismatch"]);
  });

  test("an unreachable server is a 502 api.unreachable on sync", async () => {
    const { ductor } = makeApp("http://127.0.0.1:9");
    const body = new TextEncoder().encode('{"action":"sync","url":null}');
    const answer = await ductor.handle({ method: "POST", headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now()) }, body });
    const error = decode(ErrorResponse, answer.body);
    assert.deepEqual([answer.status, error.code, error.retryable], [502, "api.unreachable", true]);
    assert.equal(APP_HEADER, "Ductor-App");
  });
});

describe("the URL an app registers with", () => {
  test("an empty url, configured or in a sync action, falls back to the one the request reached, as in Python", async () => {
    const described: (string | null)[] = [];
    const fetchStub: typeof fetch = (_input, init) => {
      const sent = decode(DescribeResponse, init?.body as Uint8Array);
      described.push(sent.url);
      const answer = encode(SyncAck, { app_id: sent.app_id, accepted: [] });
      return Promise.resolve(
        new Response(answer as Uint8Array<ArrayBuffer>, { status: 200, headers: { [SIGNATURE_HEADER]: keys.header(answer, now()) } }),
      );
    };
    const configured = new Ductor({ appId: "shop", signingKey: KEY, url: "" });
    assert.equal(configured.describe("http://app.local/api/ductor").url, "http://app.local/api/ductor");
    const ductor = new Ductor({ appId: "shop", signingKey: KEY, fetch: fetchStub });
    const body = new TextEncoder().encode('{"action":"sync","url":""}');
    const answer = await ductor.handle({
      method: "POST",
      headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now()) },
      body,
      url: "http://app.local/api/ductor",
    });
    assert.equal(answer.status, 200);
    assert.deepEqual(described, ["http://app.local/api/ductor"]);
  });
});
