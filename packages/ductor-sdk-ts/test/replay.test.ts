/** Replay semantics beyond the vectors: memoization, retries, errors, JSON forms, parallel branches. */

import assert from "node:assert/strict";
import { test } from "node:test";

import {
  Ductor,
  type Json,
  NonRetriableError,
  RetryAfterError,
  StepFailedError,
  workflowRef,
} from "../src/index.js";
import {
  ErrorResponse,
  ExecuteRequest,
  ExecuteResponse,
  type Input,
  type Opcode,
  SIGNATURE_HEADER,
  SigningKeys,
  decode,
  encode,
  stepId,
} from "../src/protocol.js";
import { execute, runToEnd } from "./engine.js";

const app = () => new Ductor({ appId: "unit", signingKey: "unit-key" });

test("a recorded step is not run again; its JSON form comes back", async () => {
  const ductor = app();
  const calls: string[] = [];
  ductor.workflow({ id: "memo" }, async (ctx) => {
    const at = await ctx.step.run("when", () => {
      calls.push("when");
      return { at: new Date(Date.UTC(2030, 0, 1)), skip: undefined, n: 1n << 70n };
    });
    const again = await ctx.step.run("when", () => {
      calls.push("when:1");
      return at.at.length;
    });
    return { at, again };
  });
  const { last, executes } = await runToEnd(ductor, "memo");
  assert.deepEqual(calls, ["when", "when:1"]);
  assert.equal(executes, 3);
  assert.deepEqual(last, {
    op: "RUN_COMPLETE",
    output: { at: { at: "2030-01-01T00:00:00.000Z", n: 1n << 70n }, again: 24 },
  });
});

test("a failing step is retried, then fails for good; the body can catch it", async () => {
  const ductor = app();
  let tries = 0;
  ductor.workflow({ id: "retry", retries: 2 }, async (ctx) => {
    try {
      await ctx.step.run("flaky", () => {
        tries += 1;
        throw new TypeError(`try ${tries}`);
      });
    } catch (err) {
      assert.ok(err instanceof StepFailedError);
      return `${err.code}: ${err.errorMessage}`;
    }
    return "no";
  });
  const first = await execute(ductor, "retry");
  assert.equal(first[0]?.op, "STEP_ERROR");
  assert.deepEqual(first[0]?.op === "STEP_ERROR" && first[0].error, {
    code: "step.error",
    message: "try 1",
    name: "TypeError",
    retryable: true,
    details: null,
  });
  const { last } = await runToEnd(ductor, "retry");
  assert.deepEqual(last, { op: "RUN_COMPLETE", output: "step.error: try 4" });
});

test("RetryAfterError asks for a delay; NonRetriableError fails at once, with details", async () => {
  const ductor = app();
  ductor.workflow({ id: "later" }, async (ctx) => {
    await ctx.step.run("rate-limited", () => {
      throw new RetryAfterError("429", { retryAfter: 90_000 });
    });
  });
  ductor.workflow({ id: "declined" }, async (ctx) => {
    await ctx.step.run("charge", () => {
      throw new NonRetriableError("card declined", { code: "card.declined", details: { bin: "4242" } });
    });
  });
  const [later] = await execute(ductor, "later");
  assert.equal(later?.op === "STEP_ERROR" && later.retry_after, "1m30s");
  const [declined] = await execute(ductor, "declined");
  assert.deepEqual(declined, {
    op: "STEP_FAILED",
    id: stepId("charge"),
    name: "charge",
    error: { code: "card.declined", message: "card declined", name: "NonRetriableError", retryable: false, details: { bin: "4242" } },
  });
});

test("a RetryAfterError whose delay is not a duration is the step's own error, not a failed execute", async () => {
  const ductor = app();
  const soon = "soon" as unknown as `${number}s`; // as from untyped code
  ductor.workflow({ id: "later" }, async (ctx) => {
    await ctx.step.run("rate-limited", () => {
      throw new RetryAfterError("429", { retryAfter: soon });
    });
  });
  const [later] = await execute(ductor, "later");
  assert.ok(later?.op === "STEP_ERROR", JSON.stringify(later));
  assert.equal(later.error.code, "duration.invalid");
  assert.equal(later.retry_after, null);
});

test("step options of the wrong type (from untyped code) are the body's error, not an answer that cannot be sent", async () => {
  type Untyped = Record<string, (name: string, options: unknown) => Promise<unknown>>;
  const ductor = app();
  ductor.workflow({ id: "no-event" }, async (ctx) =>
    (ctx.step as unknown as Untyped)["waitForEvent"]?.("shipped", { timeout: "1d" }),
  );
  ductor.workflow({ id: "version" }, async (ctx) =>
    (ctx.step as unknown as Untyped)["invoke"]?.("child", { workflow: "w", version: "2" }),
  );
  for (const id of ["no-event", "version"]) {
    const [op] = await execute(ductor, id);
    assert.ok(op?.op === "RUN_ERROR", JSON.stringify(op));
    assert.equal(op.error.name, "TypeError");
  }
});

test("the body's own errors: RUN_ERROR while retries last, then RUN_FAILED", async () => {
  const ductor = app();
  ductor.workflow({ id: "body", retries: 1 }, () => Promise.reject(new Error("boom")));
  const [first] = await execute(ductor, "body");
  assert.equal(first?.op, "RUN_ERROR");
  const [second] = await execute(ductor, "body", { attempt: 1 });
  assert.equal(second?.op === "RUN_FAILED" && second.error.code, "workflow.error");
});

test("a result that is not JSON fails the step; an output that is not JSON fails the run", async () => {
  const ductor = app();
  ductor.workflow({ id: "cyclic" }, async (ctx) => {
    await ctx.step.run("loop", () => {
      const a: Record<string, unknown> = {};
      a["self"] = a;
      return a;
    });
  });
  const [op] = await execute(ductor, "cyclic");
  assert.equal(op?.op === "STEP_FAILED" && op.error.code, "step.result_invalid");
});

test("a lone surrogate is not JSON: a result or output holding one fails cleanly, and every answer reads back", async () => {
  const half = "😀".slice(0, 1); // a string cut inside a surrogate pair
  const ductor = app();
  ductor.workflow({ id: "result" }, async (ctx) => ctx.step.run("cut", () => ({ text: `a${half}` })));
  ductor.workflow({ id: "key" }, async (ctx) => ctx.step.run("cut", () => ({ [half]: 1 })));
  ductor.workflow({ id: "output" }, () => Promise.resolve([half]));
  ductor.workflow({ id: "message" }, async (ctx) =>
    ctx.step.run("cut", () => {
      throw new NonRetriableError(`declined ${half}`, { code: `card${half}`, details: { why: half } });
    }),
  );
  ductor.workflow({ id: "name" }, async (ctx) => ctx.step.run(`cut${half}`, () => 1));
  const keys = new SigningKeys("unit-key");
  // Through the endpoint, read back as the engine reads it (the strict reader refuses lone surrogates).
  const answer = async (workflowId: string) => {
    const body = encode(ExecuteRequest, { action: "execute", run_id: "run-1", workflow_id: workflowId });
    const now = Math.floor(Date.now() / 1000);
    const res = await ductor.handle({ method: "POST", headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now) }, body });
    assert.equal(res.status, 200, new TextDecoder().decode(res.body));
    const [op] = decode(ExecuteResponse, res.body).opcodes;
    return op;
  };
  for (const id of ["result", "key"]) {
    const op = await answer(id);
    assert.equal(op?.op === "STEP_FAILED" && op.error.code, "step.result_invalid", JSON.stringify(op));
  }
  const output = await answer("output");
  assert.equal(output?.op === "RUN_FAILED" && output.error.code, "workflow.output_invalid", JSON.stringify(output));
  // Text the SDK writes from an error or a name carries U+FFFD in the surrogate's place.
  const failed = await answer("message");
  assert.ok(failed?.op === "STEP_FAILED", JSON.stringify(failed));
  assert.deepEqual(
    [failed.error.message, failed.error.code, failed.error.details],
    ["declined \ufffd", "card\ufffd", { why: "\ufffd" }],
  );
  const named = await answer("name");
  assert.ok(named?.op === "STEP_RUN", JSON.stringify(named));
  assert.deepEqual([named.name, named.id], ["cut\ufffd", stepId("cut\ufffd")]);
});

test("input is parsed by parseInput; a refusal fails the run with workflow.input_invalid", async () => {
  const ductor = app();
  ductor.workflow(
    {
      id: "typed",
      parseInput: (value: Json): { n: number } => {
        if (typeof value !== "object" || value === null || !("n" in value) || typeof value["n"] !== "number") {
          throw new Error("n must be a number");
        }
        return { n: value["n"] };
      },
    },
    (_ctx, input) => Promise.resolve(input.n * 2),
  );
  assert.deepEqual(await execute(ductor, "typed", { input: { n: 21 } }), [{ op: "RUN_COMPLETE", output: 42 }]);
  const [failed] = await execute(ductor, "typed", { input: { n: "x" } });
  assert.equal(failed?.op === "RUN_FAILED" && failed.error.code, "workflow.input_invalid");
});

test("every primitive emits its opcode; invoke of a workflow object names its app", async () => {
  const ductor = app();
  const child = ductor.workflow({ id: "child" }, (_ctx, input: { n: number }) => Promise.resolve(input.n + 1));
  const python = workflowRef<{ id: number }, { sent: boolean }>("py-shop", "send-receipt");
  ductor.workflow({ id: "all" }, async (ctx) => {
    await ctx.step.sleep("nap", "90s");
    await ctx.step.sleepUntil("midnight", new Date(Date.UTC(2030, 0, 1, 0, 0, 0, 250)));
    const shipped = await ctx.step.waitForEvent("shipped", { event: "order.shipped", timeout: "7d", match: "event.data.id == input.id" });
    const approval = await ctx.step.waitForSignal("approval", { signal: "approve", timeout: 86_400_000 });
    const plus = await ctx.step.invoke("child", { workflow: child, input: { n: 1 } });
    const receipt = await ctx.step.invoke("receipt", { workflow: python, input: { id: 7 }, timeout: "1h" });
    return { shipped: shipped?.data ?? null, approval: approval?.data ?? null, plus, receipt };
  });
  const seen: string[] = [];
  const { last } = await runToEnd(ductor, "all", null, (op) => {
    seen.push(JSON.stringify(op));
    if (op.op === "WAIT_FOR_EVENT") return { name: "order.shipped", data: { carrier: "ups" }, id: "e1", ts: null };
    if (op.op === "WAIT_FOR_SIGNAL") return { name: "approve", data: "ops" };
    if (op.op === "INVOKE") return op.app_id === "unit" ? 2 : { sent: true };
    return null;
  });
  assert.deepEqual(last, {
    op: "RUN_COMPLETE",
    output: { shipped: { carrier: "ups" }, approval: "ops", plus: 2, receipt: { sent: true } },
  });
  const [nap, midnight] = await execute(ductor, "all").then(async (first) => [
    first[0],
    (await execute(ductor, "all", { steps: [{ id: stepId("nap"), name: "nap", op: "SLEEP", result: null, error: null }] }))[0],
  ]);
  assert.deepEqual(nap, { op: "SLEEP", id: stepId("nap"), name: "nap", duration: "1m30s", until: null });
  assert.equal(midnight?.op === "SLEEP" && midnight.until, "2030-01-01T00:00:00.250000Z");
  assert.match(seen[0] ?? "", /"op":"WAIT_FOR_EVENT".*"match":"event.data.id == input.id","timeout":"7d"/);
  assert.match(seen[1] ?? "", /"signal":"approve","timeout":"1d"/);
  assert.match(seen[2] ?? "", /"workflow":"child","app_id":"unit","input":\{"n":1\}/);
  assert.match(seen[3] ?? "", /"workflow":"send-receipt","app_id":"py-shop","input":\{"id":7\},"version":null,"timeout":"1h"/);
});

test("parallel branches replay in any recorded order; a reorder inside one branch is a change", async () => {
  const branch = (tag: string, order: string[]) => {
    const ductor = app();
    ductor.workflow({ id: "branches" }, async (ctx) => {
      const one = async (name: string) => {
        const a = await ctx.step.run(`${name}-1`, () => `${name}1`);
        const b = await ctx.step.run(`${name}-2`, () => `${name}2`);
        return a + b;
      };
      return Promise.all([one("a"), one("b")]);
    });
    const history = order.map((name) => ({ id: stepId(name), name, op: "STEP_RUN" as const, result: name.replace("-", ""), error: null }));
    return { ductor, history, tag };
  };
  const ok = branch("ok", ["b-1", "a-1", "b-2", "a-2"]);
  assert.deepEqual(await execute(ok.ductor, "branches", { steps: ok.history }), [{ op: "RUN_COMPLETE", output: ["a1a2", "b1b2"] }]);
  const swapped = branch("swapped", ["a-2", "a-1", "b-1", "b-2"]);
  const [changed] = await execute(swapped.ductor, "branches", { steps: swapped.history });
  assert.equal(changed?.op === "RUN_FAILED" && changed.error.code, "workflow.changed");
  assert.deepEqual(changed?.op === "RUN_FAILED" && changed.error.details, { step: "a-2" });
});

test("a target step that was not found is a 400 step.target_not_found; an unknown workflow a 404", async () => {
  const ductor = app();
  ductor.workflow({ id: "one" }, async (ctx) => ctx.step.run("only", () => 1));
  const keys = new SigningKeys("unit-key");
  const post = async (request: Input<typeof ExecuteRequest>) => {
    const body = encode(ExecuteRequest, request);
    const answer = await ductor.handle({
      method: "POST",
      headers: { [SIGNATURE_HEADER.toLowerCase()]: keys.requestHeader(body, Math.floor(Date.now() / 1000)) },
      body,
    });
    return { status: answer.status, error: decode(ErrorResponse, answer.body) };
  };
  const missing = await post({ action: "execute", run_id: "r", workflow_id: "one", target_step: "nope" });
  assert.deepEqual([missing.status, missing.error.code], [400, "step.target_not_found"]);
  const unknown = await post({ action: "execute", run_id: "r", workflow_id: "two" });
  assert.deepEqual([unknown.status, unknown.error.code], [404, "workflow.not_found"]);
  assert.match(unknown.error.message, /serves: one/);
});

test("a step body runs at most once per execute even when the body ignores its promise", async () => {
  const ductor = app();
  let ran = 0;
  ductor.workflow({ id: "ignored" }, async (ctx) => {
    void ctx.step.run("fire", () => (ran += 1));
    return Promise.resolve("done");
  });
  const opcodes = await execute(ductor, "ignored");
  assert.equal(ran, 1);
  assert.equal(opcodes[0]?.op, "STEP_RUN");
});

test("a recorded failure the body never awaits does not crash the process", async () => {
  const ductor = app();
  ductor.workflow({ id: "unawaited" }, async (ctx) => {
    void ctx.step.run("bad", () => 1);
    return Promise.resolve("ok");
  });
  const failed = { id: stepId("bad"), name: "bad", op: "STEP_FAILED" as const, result: null, error: { code: "x", message: "y", name: null, retryable: false, details: null } };
  assert.deepEqual(await execute(ductor, "unawaited", { steps: [failed] }), [{ op: "RUN_COMPLETE", output: "ok" }]);
});

test("a slower parallel branch gets its grace before new steps are called a change", async () => {
  const ductor = app();
  ductor.workflow({ id: "slow-branch" }, async (ctx) =>
    Promise.all([
      (async () => {
        await ctx.step.run("a-1", () => "a1");
        return ctx.step.run("a-2", () => "a2");
      })(),
      (async () => {
        await new Promise((resolve) => setTimeout(resolve, 100)); // not a step: allowed a grace
        return ctx.step.run("b-1", () => "b1");
      })(),
    ]),
  );
  const recorded = (name: string) => ({ id: stepId(name), name, op: "STEP_RUN" as const, result: name.replace("-", ""), error: null });
  const opcodes = await execute(ductor, "slow-branch", { steps: [recorded("a-1"), recorded("b-1")] });
  assert.deepEqual(opcodes, [{ op: "STEP_RUN", id: stepId("a-2"), name: "a-2", result: "a2" }]);
});

test("an error whose text cannot be read still fails its step or body, never the answer", async () => {
  const nested = (depth: number): unknown[] => {
    let value: unknown[] = [];
    for (let i = 0; i < depth; i++) value = [value];
    return value;
  };
  const unprintable = {
    toString(): string {
      throw new Error("no text for this value");
    },
  };
  const badMessage = new Error("hidden");
  Object.defineProperty(badMessage, "message", {
    get(): string {
      throw new Error("no message");
    },
  });
  const ductor = app();
  const thrower = (id: string, value: () => unknown) =>
    ductor.workflow({ id, retries: 0 }, async (ctx) =>
      ctx.step.run("s", () => {
        throw value();
      }),
    );
  thrower("deep-value", () => nested(100_000));
  thrower("unprintable-value", () => unprintable);
  thrower("getter-message", () => badMessage);
  thrower("deep-details", () => new NonRetriableError("declined", { code: "card.declined", details: nested(100_000) }));
  thrower("unprintable-details", () => new NonRetriableError("declined", { code: "card.declined", details: unprintable }));
  ductor.workflow({ id: "throwing-result" }, async (ctx) =>
    ctx.step.run("s", () => ({
      get field(): string {
        throw unprintable; // eslint-disable-line @typescript-eslint/only-throw-error
      },
    })),
  );
  ductor.workflow({ id: "body", retries: 0 }, () => Promise.reject(unprintable)); // eslint-disable-line @typescript-eslint/prefer-promise-reject-errors
  const keys = new SigningKeys("unit-key");
  const answer = async (workflowId: string) => {
    const body = encode(ExecuteRequest, { action: "execute", run_id: "run-1", workflow_id: workflowId });
    const now = Math.floor(Date.now() / 1000);
    const res = await ductor.handle({ method: "POST", headers: { [SIGNATURE_HEADER]: keys.requestHeader(body, now) }, body });
    assert.equal(res.status, 200, `${workflowId}: ${new TextDecoder().decode(res.body)}`);
    const [op] = decode(ExecuteResponse, res.body).opcodes;
    return op;
  };
  for (const [id, code] of [
    ["deep-value", "step.error"],
    ["unprintable-value", "step.error"],
    ["getter-message", "step.error"],
    ["deep-details", "card.declined"],
    ["unprintable-details", "card.declined"],
    ["throwing-result", "step.result_invalid"],
  ] as const) {
    const op = await answer(id);
    assert.ok(op?.op === "STEP_FAILED", `${id}: ${JSON.stringify(op)}`);
    assert.equal(op.error.code, code, id);
  }
  const [getter] = await execute(ductor, "getter-message");
  assert.ok(getter?.op === "STEP_FAILED");
  assert.equal(getter.error.name, "Error");
  assert.match(getter.error.message, /could not be read/);
  const body = await answer("body");
  assert.equal(body?.op === "RUN_FAILED" && body.error.code, "workflow.error", JSON.stringify(body));
});

test("a step called inside a step's function fails that step at once, instead of waiting for it forever", async () => {
  const ductor = app();
  let innerRan = false;
  ductor.workflow({ id: "nested", retries: 3 }, async (ctx) => {
    await ctx.step.run("outer", async () => {
      await ctx.step.run("inner", () => {
        innerRan = true;
        return 1;
      });
      return 2;
    });
  });
  ductor.workflow({ id: "nested-sleep" }, async (ctx) => {
    await ctx.step.run("outer", async () => {
      await ctx.step.sleep("nap", "1s");
    });
  });
  // A step that merely runs after another, in the body, is not nested.
  ductor.workflow({ id: "flat" }, async (ctx) => {
    const a = await ctx.step.run("a", () => 1);
    return ctx.step.run("b", () => a + 1);
  });
  const bounded = (work: Promise<Opcode[]>) =>
    Promise.race([
      work,
      new Promise<never>((_, reject) => {
        setTimeout(() => {
          reject(new Error("the execute hung"));
        }, 5_000);
      }),
    ]);
  for (const id of ["nested", "nested-sleep"]) {
    const [op, ...rest] = await bounded(execute(ductor, id));
    assert.equal(rest.length, 0);
    assert.equal(op?.op, "STEP_FAILED", JSON.stringify(op));
    assert.ok(op?.op === "STEP_FAILED");
    assert.equal(op.name, "outer");
    assert.equal(op.error.code, "step.nested");
    assert.equal(op.error.retryable, false);
    assert.match(op.error.message, /inside step 'outer'/);
  }
  assert.equal(innerRan, false);
  const { last } = await runToEnd(ductor, "flat");
  assert.deepEqual(last, { op: "RUN_COMPLETE", output: 2 });
});
