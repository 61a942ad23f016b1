/**
 * The example shop's workflows, hosted in a Node app through `@ductor/sdk`.
 *
 * Every step body appends its name to `APP_LOG`, so a test can count how often
 * each body ran. Configured by the environment: DUCTOR_URL, DUCTOR_API_KEY,
 * DUCTOR_SIGNING_KEY (this app's key), APP_URL (where the server reaches it),
 * APP_LOG, PY_APP_ID (the Python-SDK app serving `send-receipt`).
 */

import { appendFileSync } from "node:fs";

import { Ductor, workflowRef } from "@ductor/sdk";

/** An order, the input of `fulfil`. */
export interface Order {
  readonly id: number;
  readonly total: number;
}

/** The events this app waits for. */
export interface Events {
  "ts.order.shipped": { order_id: number; carrier: string };
}

const env = process.env;
const LOG = env["APP_LOG"] ?? "ts-shop.log";

/** Append one line to the execution log at once (the app may be killed any moment). */
export function note(line: string): void {
  appendFileSync(LOG, line + "\n");
}

export const ductor = new Ductor<Events>({
  appId: env["APP_ID"] ?? "ts-shop",
  signingKey: env["DUCTOR_SIGNING_KEY"] ?? "signkey-dev-0001",
  serverUrl: env["DUCTOR_URL"] ?? "http://127.0.0.1:7070",
  apiKey: env["DUCTOR_API_KEY"] ?? null,
  url: env["APP_URL"] ?? null,
});

/** `send-receipt`, served by the Python SDK's example app. */
const sendReceipt = workflowRef<{ charge_id: string; amount: number }, { sent: boolean; charge_id: string }>(
  env["PY_APP_ID"] ?? "shop",
  "send-receipt",
);

/** Charge, label in parallel, cool off, wait for shipping and approval, invoke a Python workflow, finish. */
export const fulfil = ductor.workflow({ id: "fulfil", retries: 2, timeout: "10m" }, async (ctx, order: Order) => {
  const charge = await ctx.step.run("charge", () => {
    note("charge");
    return { charge_id: `ch_${order.id}`, amount: order.total };
  });
  const labels = await Promise.all([
    ctx.step.run("label-box", () => {
      note("label-box");
      return `box-${order.id}`;
    }),
    ctx.step.run("label-invoice", () => {
      note("label-invoice");
      return `invoice-${order.id}`;
    }),
  ]);
  await ctx.step.sleep("cool-off", "1s");
  const shipped = await ctx.step.waitForEvent("shipped", {
    event: "ts.order.shipped",
    match: "event.data.order_id == input.id",
    timeout: "2m",
  });
  const approval = await ctx.step.waitForSignal<string>("approval", { signal: "approve", timeout: "2m" });
  const receipt = await ctx.step.invoke("receipt", { workflow: sendReceipt, input: charge });
  const done = await ctx.step.run("finish", () => {
    note("finish");
    return `order ${order.id} done`;
  });
  return {
    charge,
    labels,
    carrier: shipped?.data.carrier ?? null,
    approvedBy: approval?.data ?? null,
    receipt,
    done,
  };
});

/** Two steps over a large input: with the first result recorded, executes outgrow 1 MiB and go by reference. */
export const shout = ductor.workflow({ id: "shout" }, async (ctx, text: string) => {
  const upper = await ctx.step.run("upper", () => text.toUpperCase());
  return ctx.step.run("length", () => upper.length);
});
