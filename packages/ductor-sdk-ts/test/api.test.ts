/**
 * The REST client's `waitForResult` against a real HTTP server on 127.0.0.1:
 * it long-polls (`GET /v1/runs/{id}?wait=`), and pauses between requests only
 * when the server answers at once.
 */

import assert from "node:assert/strict";
import { type Server, type ServerResponse, createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, describe, test } from "node:test";

import { ApiClient, ApiError, LONG_POLL_SECONDS } from "../src/api.js";
import { DuctorError, WaitTimeoutError } from "../src/index.js";

interface Seen {
  readonly path: string;
  readonly wait: number | null;
  readonly at: number;
}

/** What the server answers for a run: its status now, and how long it holds the request. */
type Answer = (seen: readonly Seen[]) => { status: string; holdMs: number; refuse?: boolean };

let server: Server;
let baseUrl = "";
let answer: Answer = () => ({ status: "RUN_STATUS_SUCCEEDED", holdMs: 0 });
const seen: Seen[] = [];

function reply(res: ServerResponse, status: string): void {
  res.writeHead(200, { "content-type": "application/json" });
  res.end(JSON.stringify({ id: "run-1", family_slug: "f", version: 1, status, input: null, output: null, steps: [] }));
}

before(async () => {
  server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://127.0.0.1");
    const wait = url.searchParams.get("wait");
    seen.push({ path: url.pathname, wait: wait === null ? null : Number(wait), at: Date.now() });
    const { status, holdMs, refuse = false } = answer(seen);
    if (refuse) {
      // Too many of the tenant's requests wait in this server: it will not hold one more.
      res.writeHead(429, { "content-type": "application/json" });
      res.end(JSON.stringify({ code: "run.wait_limit", message: "too many waiting requests", details: { limit: 1000 } }));
      return;
    }
    setTimeout(() => {
      reply(res, status);
    }, holdMs);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

describe("waitForResult", () => {
  test("asks the server to hold the request until the run ends", async () => {
    seen.length = 0;
    answer = () => ({ status: "RUN_STATUS_SUCCEEDED", holdMs: 50 });
    const api = new ApiClient({ baseUrl, apiKey: "k" });
    const run = await api.waitForResult("run-1", { timeoutMs: 10_000 });
    assert.equal(run.status, "RUN_STATUS_SUCCEEDED");
    assert.equal(seen.length, 1);
    assert.equal(seen[0]?.path, "/v1/runs/run-1");
    // The time left, under the long poll's cap: 10 s less the milliseconds the
    // call took before it asked (a loaded machine may take a few).
    const wait = seen[0]?.wait ?? 0;
    assert.ok(wait > 9.9 && wait <= 10, `asked wait=${wait}`);
  });

  test("asks for at most LONG_POLL_SECONDS, and again while the run goes on", async () => {
    seen.length = 0;
    // A server that holds each request a little (as if its wait ran out) before the run ends.
    answer = (s) => ({ status: s.length < 3 ? "RUN_STATUS_RUNNING" : "RUN_STATUS_SUCCEEDED", holdMs: 30 });
    const api = new ApiClient({ baseUrl });
    const started = Date.now();
    await api.waitForResult("run-1", { timeoutMs: 120_000, intervalMs: 500 });
    assert.deepEqual(
      seen.map((s) => s.wait),
      [LONG_POLL_SECONDS, LONG_POLL_SECONDS, LONG_POLL_SECONDS],
    );
    // Answered at once (30 ms of 30 s): the client paused between requests.
    assert.ok(Date.now() - started >= 2 * 500 - 20, `took ${Date.now() - started} ms`);
  });

  test("does not pause after a request the server held", async () => {
    seen.length = 0;
    // Asked to wait 0.25 s, the server holds the first request 150 ms (more
    // than half): the second request goes at once, asking for the time left.
    answer = (s) => ({
      status: s.length < 2 ? "RUN_STATUS_RUNNING" : "RUN_STATUS_SUCCEEDED",
      holdMs: s.length < 2 ? 150 : 0,
    });
    const api = new ApiClient({ baseUrl });
    const started = Date.now();
    const run = await api.waitForResult("run-1", { timeoutMs: 250, intervalMs: 60_000 });
    assert.equal(run.status, "RUN_STATUS_SUCCEEDED");
    assert.equal(seen.length, 2);
    assert.ok(Date.now() - started < 5_000, "it paused though the server held the request");
    const second = seen[1]?.wait ?? 0;
    assert.ok(second > 0 && second <= 0.1, `second wait ${second}`);
  });

  test("throws once the deadline has passed, naming the run and its status", async () => {
    seen.length = 0;
    answer = () => ({ status: "RUN_STATUS_RUNNING", holdMs: 0 });
    const api = new ApiClient({ baseUrl });
    await assert.rejects(api.waitForResult("run-1", { timeoutMs: 150, intervalMs: 20 }), /run 'run-1' still RUN_STATUS_RUNNING after 150ms/);
    assert.ok(seen.length >= 2);
    assert.ok(seen.every((s) => s.wait !== null && s.wait > 0 && s.wait <= 0.15));
  });

  test("asks again after intervalMs while the server will not hold the request (429), until the deadline", async () => {
    seen.length = 0;
    answer = (s) => ({ status: "RUN_STATUS_SUCCEEDED", holdMs: 0, refuse: s.length < 3 });
    const api = new ApiClient({ baseUrl });
    const started = Date.now();
    const run = await api.waitForResult("run-1", { timeoutMs: 10_000, intervalMs: 100 });
    assert.equal(run.status, "RUN_STATUS_SUCCEEDED");
    assert.equal(seen.length, 3);
    assert.ok(Date.now() - started >= 2 * 100 - 20, `took ${Date.now() - started} ms`);
    // Refused past the deadline: the 429 itself is thrown.
    seen.length = 0;
    answer = () => ({ status: "RUN_STATUS_RUNNING", holdMs: 0, refuse: true });
    const err: unknown = await api.waitForResult("run-1", { timeoutMs: 150, intervalMs: 20 }).then(
      () => assert.fail("resolved though the server never answered the run"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof ApiError, `threw ${String(err)}`);
    assert.equal(err.status, 429);
    assert.equal(err.code, "run.wait_limit");
    assert.ok(seen.length >= 2);
  });

  test("throws a WaitTimeoutError a caller can tell from a failed request", async () => {
    seen.length = 0;
    answer = () => ({ status: "RUN_STATUS_RUNNING", holdMs: 0 });
    const api = new ApiClient({ baseUrl });
    const err: unknown = await api.waitForResult("run-1", { timeoutMs: 100, intervalMs: 20 }).then(
      () => assert.fail("resolved though the run never ended"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof WaitTimeoutError, `threw ${String(err)}`);
    assert.ok(err instanceof DuctorError);
    assert.equal(err.name, "WaitTimeoutError");
    assert.equal(err.code, "run.wait_timeout");
    assert.equal(err.retryable, true);
    assert.equal(err.runId, "run-1");
    assert.equal(err.timeoutMs, 100);
    assert.equal(err.run.status, "RUN_STATUS_RUNNING");
    assert.deepEqual(err.details, { run_id: "run-1", status: "RUN_STATUS_RUNNING", timeout_ms: 100 });
  });
});

describe("request bodies", () => {
  test("an input, payload or event data holding a lone surrogate is refused before anything is sent", async () => {
    seen.length = 0;
    const api = new ApiClient({ baseUrl });
    const half = "😀".slice(0, 1);
    await assert.rejects(api.trigger("family", { text: half }), /lone surrogate/);
    await assert.rejects(api.signal("run-1", "approve", { [half]: 1 }), TypeError);
    await assert.rejects(api.sendEvent("order.shipped", [half]), TypeError);
    assert.equal(seen.length, 0);
  });
});

describe("answers of the wrong shape", () => {
  /** Answer every request with `status` and `text`, run `call`, and return what it threw. */
  async function thrown(status: number, text: string, call: (api: ApiClient) => Promise<unknown>): Promise<unknown> {
    const fetchStub: typeof fetch = () =>
      Promise.resolve(new Response(text, { status, headers: { "content-type": "application/json" } }));
    return call(new ApiClient({ fetch: fetchStub })).then(
      (value) => assert.fail(`resolved with ${JSON.stringify(value)} for the answer ${text}`),
      (e: unknown) => e,
    );
  }

  const run = '{"id":"run-1","status":"RUN_STATUS_SUCCEEDED"}';
  const cases: readonly [string, string, (api: ApiClient) => Promise<unknown>, RegExp][] = [
    ["getRun", "null", (api) => api.getRun("run-1"), /expected an object, got null/],
    ["getRun", "[]", (api) => api.getRun("run-1"), /expected an object, got a list/],
    ["getRun", '{"id":"run-1","status":5}', (api) => api.getRun("run-1"), /'status' must be a string/],
    ["waitForResult", '"done"', (api) => api.waitForResult("run-1", { timeoutMs: 200 }), /expected an object, got string/],
    ["waitForResult", '{"id":"run-1"}', (api) => api.waitForResult("run-1", { timeoutMs: 200 }), /'status' must be a string/],
    ["trigger", '{"id":7,"status":"RUN_STATUS_RUNNING"}', (api) => api.trigger("f"), /'id' must be a string/],
    ["cancel", `${run.slice(0, -1)},"version":"1"}`, (api) => api.cancel("run-1"), /'version' must be an integer or null/],
    ["sendEvent", '{"id":"e","runs_started":"run-1"}', (api) => api.sendEvent("e"), /'runs_started' must be a list of strings/],
    ["sendEvent", '{"runs_refused":[{"code":"x"}]}', (api) => api.sendEvent("e"), /'runs_refused' must be a list/],
    ["signal", "5", (api) => api.signal("run-1", "approve"), /expected an object, got number/],
  ];
  for (const [name, text, call, message] of cases) {
    test(`${name} answered ${text} throws ApiError api.bad_response`, async () => {
      const err = await thrown(200, text, call);
      assert.ok(err instanceof ApiError, `threw ${String(err)}`);
      assert.equal(err.code, "api.bad_response");
      assert.equal(err.status, 200);
      assert.match(err.message, message);
    });
  }

  test("an answer with more fields than the client knows is kept whole", async () => {
    const fetchStub: typeof fetch = () =>
      Promise.resolve(new Response('{"id":"run-1","status":"RUN_STATUS_SUCCEEDED","new_field":[1]}', { status: 200 }));
    const got = await new ApiClient({ fetch: fetchStub }).getRun("run-1");
    assert.deepEqual(got["new_field"], [1]);
  });
});

describe("failed calls", () => {
  test("an error answer and an unreachable server are ApiErrors with status, code, message, details and retryable", async () => {
    const refusing = createServer((_req, res) => {
      res.writeHead(404, { "content-type": "application/json" });
      res.end(JSON.stringify({ code: "run.not_found", message: "run 'run-x' not found", details: { run_id: "run-x" } }));
    });
    await new Promise<void>((resolve) => refusing.listen(0, "127.0.0.1", resolve));
    const port = (refusing.address() as AddressInfo).port;
    const failure = (call: Promise<unknown>) =>
      call.then(
        () => assert.fail("resolved"),
        (e: unknown) => e,
      );
    try {
      const missing = await failure(new ApiClient({ baseUrl: `http://127.0.0.1:${port}` }).getRun("run-x"));
      assert.ok(missing instanceof ApiError, String(missing));
      assert.deepEqual(
        [missing.status, missing.code, missing.message, missing.details, missing.retryable],
        [404, "run.not_found", "run 'run-x' not found", { run_id: "run-x" }, false],
      );
    } finally {
      await new Promise((resolve) => refusing.close(resolve));
    }
    // Nothing listens on the port now.
    const api = new ApiClient({ baseUrl: `http://127.0.0.1:${port}` });
    const calls = [
      () => api.getRun("run-x"),
      () => api.trigger("f", {}),
      () => api.sendEvent("e", {}),
      () => api.waitForResult("run-x", { timeoutMs: 500 }),
    ];
    for (const call of calls) {
      const err = await failure(call());
      assert.ok(err instanceof ApiError && !(err instanceof WaitTimeoutError), String(err));
      assert.deepEqual([err.status, err.code, err.retryable], [0, "api.unreachable", true]);
    }
  });

  test("ApiError and WaitTimeoutError are the same classes from @ductor/sdk and @ductor/sdk/api", async () => {
    const [root, entry] = await Promise.all([import("../src/index.js"), import("../src/api.js")]);
    assert.equal(root.ApiError, entry.ApiError);
    assert.equal(root.WaitTimeoutError, entry.WaitTimeoutError);
  });
});
