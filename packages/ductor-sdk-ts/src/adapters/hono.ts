/**
 * Hono adapter: `app.on(["GET", "POST"], "/api/ductor", ductorHono(ductor))`.
 * Typed structurally, so the SDK does not depend on Hono.
 */

import type { BridgeHost } from "../client.js";
import { fetchHandler } from "./fetch.js";
import type { AdapterOptions } from "./node.js";

/** The part of Hono's context the adapter uses. */
export interface HonoContextLike {
  readonly req: { readonly raw: Request };
}

/** A Hono handler answering `ductor`'s bridge endpoint on the route it is mounted at. */
export function ductorHono(ductor: BridgeHost, options: AdapterOptions = {}): (c: HonoContextLike) => Promise<Response> {
  const handler = fetchHandler(ductor, options);
  return (c) => handler(c.req.raw);
}
