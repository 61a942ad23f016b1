/** Workflow options as `describe` reports them to the server, and the ones refused at registration. */

import assert from "node:assert/strict";
import { test } from "node:test";

import { Ductor, DuctorError, DurationError, type Trigger, canonicalDuration } from "../src/index.js";
import { DescribeResponse, decode, encode } from "../src/protocol.js";

const app = () => new Ductor({ appId: "unit", signingKey: "unit-key" });
const body = async () => Promise.resolve(null);

/** The workflow's description as it travels (encoded and read back). */
function described(ductor: Ductor, id: string) {
  const wire = decode(DescribeResponse, encode(DescribeResponse, ductor.describe()));
  const found = wire.workflows.find((wf) => wf.id === id);
  assert.ok(found, `workflow ${id} is not described`);
  return found;
}

test("a trigger needs exactly one of event and cron", () => {
  const ductor = app();
  const both = { event: "order.created", cron: "0 * * * *" } as unknown as Trigger;
  assert.throws(() => ductor.workflow({ id: "both", trigger: both }, body), TypeError);
  assert.throws(() => ductor.workflow({ id: "neither", trigger: [{} as unknown as Trigger] }, body), TypeError);
  assert.equal(ductor.workflows.size, 0);
});

test("a cron trigger's match is sent as given, for the server to refuse", () => {
  const ductor = app();
  const cron = { cron: "0 * * * *", match: "true" } as unknown as Trigger;
  ductor.workflow({ id: "hourly", trigger: ["order.created", { event: "order.paid", match: "event.data.ok" }, cron] }, body);
  assert.deepEqual(described(ductor, "hourly").triggers, [
    { event: "order.created", cron: null, match: null },
    { event: "order.paid", cron: null, match: "event.data.ok" },
    { event: null, cron: "0 * * * *", match: "true" },
  ]);
});

test("a concurrency rate's period travels in its canonical form; its burst is at most its limit", () => {
  const ductor = app();
  ductor.workflow({ id: "text", concurrency: { limit: 2, key: "input.id", rate: { limit: 5, period: "90s", burst: 5 } } }, body);
  ductor.workflow({ id: "ms", concurrency: { rate: { limit: 5, period: 60_000 } } }, body);
  assert.deepEqual(described(ductor, "text").concurrency, {
    limit: 2,
    key: "input.id",
    rate: { limit: 5, period: "1m30s", burst: 5 },
  });
  assert.deepEqual(described(ductor, "ms").concurrency?.rate, { limit: 5, period: "1m", burst: 1 });
  assert.throws(
    () => ductor.workflow({ id: "burst", concurrency: { rate: { limit: 2, period: "1m", burst: 3 } } }, body),
    RangeError,
  );
});

test("a duration travels as the Python SDK writes it: half a millisecond rounds to the even one", () => {
  // ductor.durations.canonical_duration's answers (Python's round() goes half to even).
  const python: [string | number, string][] = [
    ["0.5ms", "0s"],
    ["1.5ms", "2ms"],
    ["2.5ms", "2ms"],
    ["3.5ms", "4ms"],
    ["1s0.5ms", "1s"],
    ["0.0025s", "2ms"],
    [0.5, "0s"],
    [2.5, "2ms"],
    [1500.5, "1s500ms"],
    [0.4999, "0s"],
    ["90s", "1m30s"],
  ];
  assert.deepEqual(
    python.map(([given]) => [given, canonicalDuration(given)]),
    python,
  );
  const ductor = app();
  ductor.workflow({ id: "half", timeout: 2.5 }, body);
  assert.equal(described(ductor, "half").timeout, "2ms");
});

test("options of the wrong type (from untyped JavaScript) are refused at registration, not at sync", () => {
  const ductor = app();
  const bad = (options: Record<string, unknown>) => () => ductor.workflow({ id: "bad", ...options }, body);
  assert.throws(bad({ trigger: "" }), /trigger event must not be empty/);
  assert.throws(bad({ trigger: { event: "" } }), /trigger event must not be empty/);
  assert.throws(bad({ trigger: { event: "a", match: 5 } }), /trigger match must be a string/);
  assert.throws(bad({ trigger: { cron: 5 } }), /trigger cron must be a string/);
  assert.throws(bad({ name: 5 }), /name must be a string/);
  assert.throws(bad({ concurrency: { limit: 1, key: 5 } }), /concurrency key must be a string/);
  assert.throws(bad({ concurrency: { rate: { limit: 1, period: 0 } } }), /rate period must be longer than zero/);
  assert.throws(bad({ concurrency: { rate: { limit: 1, period: "0s" } } }), /rate period must be longer than zero/);
  assert.throws(bad({ concurrency: "3" }), /concurrency must be a number or/);
  assert.throws(bad({ concurrency: { rate: null } }), /concurrency rate must be \{ limit, period, burst\? \}, got null/);
  assert.throws(bad({ concurrency: { rate: "1/s" } }), /concurrency rate must be \{ limit, period, burst\? \}/);
  assert.throws(bad({ parseInput: "zod" }), /parseInput must be a function, got string/);
  const badId = (id: unknown) => () => ductor.workflow({ id } as { id: string }, body);
  assert.throws(badId(5), (err) => err instanceof TypeError && /workflow id must be a string, got 5/.test(err.message));
  assert.throws(badId({}), TypeError);
  assert.throws(badId(""), /workflow id must not be empty/);
  assert.equal(ductor.workflows.size, 0);
  encode(DescribeResponse, ductor.describe()); // nothing half-registered
});

test("an app id that cannot make a slug (bridge:<appId>:<id>) is refused", () => {
  assert.throws(() => new Ductor({ appId: "", signingKey: "k" }), /appId must not be empty/);
  assert.throws(() => new Ductor({ appId: "a:b", signingKey: "k" }), /appId must not contain ':'/);
});

test("a timeout of zero and an onCancel that is no function are refused at registration", () => {
  const ductor = app();
  // Every run would time out at once; a sync refuses it too.
  assert.throws(() => ductor.workflow({ id: "zero", timeout: "0s" }, body), RangeError);
  assert.throws(() => ductor.workflow({ id: "zero-ms", timeout: 0 }, body), RangeError);
  const notAFunction = { onCancel: "cleanup" } as unknown as { onCancel: () => void };
  assert.throws(() => ductor.workflow({ id: "cancel", ...notAFunction }, body), TypeError);
  assert.equal(ductor.workflows.size, 0);
  ductor.workflow({ id: "second", timeout: "1s" }, body);
  assert.equal(described(ductor, "second").timeout, "1s");
});

test("a cancel handler's error is answered whatever was thrown, its text unreadable too", async () => {
  const ductor = app();
  const thrown: unknown[] = [
    new DuctorError("refund failed", { code: "refund.failed", details: { order: 7 } }),
    new Error("plain"),
    Object.create(null), // String() of it throws
    {
      toString() {
        throw new Error("no text");
      },
    },
  ];
  let next = 0;
  ductor.workflow(
    {
      id: "cancellable",
      onCancel: () => {
        throw thrown[next++];
      },
    },
    body,
  );
  const answers = [];
  for (let i = 0; i < thrown.length; i++) {
    answers.push(await ductor.cancel({ action: "cancel", run_id: `run-${i}`, workflow_id: "cancellable", input: null, reason: null }));
  }
  assert.deepEqual(
    answers.map((a) => [a.handled, a.error?.code, a.error?.retryable]),
    [
      [true, "refund.failed", false],
      [true, "cancel.error", false],
      [true, "cancel.error", false],
      [true, "cancel.error", false],
    ],
  );
  assert.deepEqual(answers[0]?.error?.details, { order: 7 });
  assert.equal(answers[1]?.error?.message, "plain");
  assert.match(answers[2]?.error?.message ?? "", /could not be read/);
  assert.match(answers[3]?.error?.message ?? "", /could not be read/);
});

test("a body that is no function is refused at registration, not when a run executes it", () => {
  const ductor = app();
  const notABody = (value: unknown) => () =>
    ductor.workflow({ id: "no-body" }, value as () => Promise<null>);
  for (const value of [5, "async () => 1", null, undefined, {}]) {
    assert.throws(notABody(value), (err) => err instanceof TypeError && /workflow body must be a function/.test(err.message));
  }
  assert.equal(ductor.workflows.size, 0);
});

test("a refused option's message shows the value given: a number sent as text, NaN, Infinity", () => {
  const ductor = app();
  const bad = (options: Record<string, unknown>) => () => ductor.workflow({ id: "bad", ...options }, body);
  assert.throws(bad({ retries: "3" }), (err) => err instanceof RangeError && err.message === 'retries must be an integer >= 0, got "3"');
  assert.throws(bad({ concurrency: { limit: "2" } }), /concurrency limit must be an integer >= 1, got "2"$/);
  assert.throws(bad({ concurrency: { rate: { limit: "5", period: "1s" } } }), /rate limit must be an integer >= 1, got "5"$/);
  assert.throws(bad({ concurrency: { rate: { limit: 5, period: "1s", burst: "1" } } }), /got "1"$/);
  for (const timeout of [Number.NaN, Number.POSITIVE_INFINITY]) {
    assert.throws(
      bad({ timeout }),
      (err) => err instanceof DurationError && err.message === `duration must be a finite number of milliseconds, got ${timeout}`,
    );
  }
  assert.throws(bad({ timeout: 4e12 }), (err) => err instanceof DurationError && /at most 100 years/.test(err.message));
  assert.equal(ductor.workflows.size, 0);
});
