/**
 * The typing test of the public API: this file only has to compile (it is
 * never run). Each `@ts-expect-error` line must fail to type-check, so a
 * loosened type fails the build (`tsc` reports an unused directive).
 */

/* eslint-disable @typescript-eslint/no-unnecessary-type-parameters -- type-level helpers */

import { ApiClient, ApiError, type Run, WaitTimeoutError } from "../../src/api.js";
import { Ductor, type Json, NonRetriableError, RetryAfterError, StepFailedError, workflowRef } from "../../src/index.js";
import { ExecuteRequest, type Infer, type Input, decode, encode } from "../../src/protocol.js";

type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function expectType<T>(_value: T): void {
  // type-level only
}
function assertEqual<_ extends true>(): void {
  // type-level only
}

interface Events {
  "order.created": { id: number; total: number };
  "order.shipped": { order_id: number; carrier: string; at: Date };
}

export function typing(): void {
  const ductor = new Ductor<Events>({ appId: "shop", signingKey: "k", fallbackSigningKey: "old" });

  // @ts-expect-error appId is required
  new Ductor({ signingKey: "k" });

  const receipt = workflowRef<{ charge_id: string }, { sent: boolean }>("py-shop", "send-receipt");

  const charge = ductor.workflow(
    { id: "charge", trigger: "order.created", retries: 2, concurrency: { limit: 5, key: "input.id" }, timeout: "1h30m" },
    async (ctx, order: Events["order.created"]) => {
      const charged = await ctx.step.run("charge", () => ({ id: `ch_${order.id}`, at: new Date(), skip: undefined }));
      expectType<{ id: string; at: string }>(charged);
      assertEqual<Equal<typeof charged, { id: string; at: string }>>();

      await ctx.step.sleep("cool-off", "10m");
      await ctx.step.sleep("ms", 1500);
      // @ts-expect-error not a duration string
      await ctx.step.sleep("bad", "10 minutes");
      await ctx.step.sleepUntil("later", new Date());

      const shipped = await ctx.step.waitForEvent("shipped", { event: "order.shipped", timeout: "7d" });
      if (shipped !== null) {
        expectType<number>(shipped.data.order_id);
        expectType<string>(shipped.data.at); // a Date travels as its ISO string
      }
      // @ts-expect-error an event this app does not declare
      await ctx.step.waitForEvent("nope", { event: "order.lost", timeout: "1d" });
      // @ts-expect-error timeout is required
      await ctx.step.waitForEvent("no-timeout", { event: "order.shipped" });

      const approval = await ctx.step.waitForSignal<{ by: string }>("approval", { timeout: "1d", signal: "approve" });
      expectType<string | undefined>(approval?.data.by);

      const sent = await ctx.step.invoke("receipt", { workflow: receipt, input: { charge_id: charged.id } });
      expectType<boolean>(sent.sent);
      // @ts-expect-error the invoked workflow's input is typed
      await ctx.step.invoke("receipt-2", { workflow: receipt, input: { charge: 1 } });
      const any = await ctx.step.invoke("dag", { workflow: "send-receipt", version: 3, input: { x: 1 } });
      expectType<Json>(any);

      try {
        await ctx.step.run("declined", () => {
          throw new NonRetriableError("declined", { code: "card.declined", details: { bin: "4242" } });
        });
      } catch (err) {
        if (err instanceof StepFailedError) expectType<string>(err.step);
      }
      await ctx.step.run("later", () => {
        throw new RetryAfterError("429", { retryAfter: "30s" });
      });
      // @ts-expect-error a retry delay is a duration
      new RetryAfterError("429", { retryAfter: "soon" });
      // @ts-expect-error step.run needs a function
      await ctx.step.run("not-a-function", 42);
      return { charged, sent };
    },
  );
  expectType<string>(charge.id);

  // @ts-expect-error a trigger this app does not declare
  ductor.workflow({ id: "bad-trigger", trigger: "order.lost" }, () => Promise.resolve(null));
  ductor.workflow({ id: "cron", trigger: { cron: "0 * * * *" } }, () => Promise.resolve(null));
  // @ts-expect-error timeout must be a duration
  ductor.workflow({ id: "bad-timeout", timeout: "soon" }, () => Promise.resolve(null));
  // @ts-expect-error a body must return a promise
  ductor.workflow({ id: "sync-body" }, () => 1);

  const api = new ApiClient({ baseUrl: "http://127.0.0.1:7070", apiKey: "key" });
  void (async () => {
    const run = await api.trigger(charge, { id: 7, total: 500 }, { idempotencyKey: "order-7" });
    const done = await api.waitForResult<typeof run extends Run<infer O> ? O : never>(run.id);
    expectType<{ id: string; at: string } | undefined>(done.output?.charged);
    // @ts-expect-error the workflow's input is typed
    await api.trigger(charge, { id: "7" });
    const byName = await api.trigger("send-receipt", { any: "json" }, { version: 2 });
    expectType<Json | null>(byName.output);
    await api.sendEvent("order.shipped", { order_id: 7 }, { id: "evt-7" });
    await api.signal(run.id, "approve", { by: "ops" });
    try {
      await api.waitForResult(run.id, { timeoutMs: 1000 });
    } catch (err) {
      if (err instanceof WaitTimeoutError) expectType<[string, number, string]>([err.runId, err.timeoutMs, err.run.status]);
      if (err instanceof ApiError) expectType<[number, string, boolean]>([err.status, err.code, err.retryable]);
    }
  })();

  // Wire messages: decoded types have every field; the written form may leave defaults out.
  const request = decode(ExecuteRequest, '{"action":"execute","run_id":"r","workflow_id":"w"}');
  expectType<Infer<typeof ExecuteRequest>>(request);
  expectType<number>(request.attempt);
  const minimal: Input<typeof ExecuteRequest> = { action: "execute", run_id: "r", workflow_id: "w" };
  encode(ExecuteRequest, minimal);
  // @ts-expect-error run_id is required
  encode(ExecuteRequest, { action: "execute", workflow_id: "w" });
  // @ts-expect-error attempt is a number
  encode(ExecuteRequest, { action: "execute", run_id: "r", workflow_id: "w", attempt: "2" });
}
