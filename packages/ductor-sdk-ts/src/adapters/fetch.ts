/**
 * The web-standard adapter: a `(Request) => Promise<Response>` handler for
 * runtimes and frameworks built on `fetch` (Hono, Next.js route handlers,
 * Bun.serve, Deno.serve, Cloudflare-style workers).
 */

import type { BridgeHost } from "../client.js";
import { type AdapterOptions, MAX_BODY_BYTES } from "./node.js";

export type { AdapterOptions } from "./node.js";

async function readLimited(request: Request, limit: number): Promise<Uint8Array | null> {
  const declared = Number(request.headers.get("content-length") ?? "0");
  if (declared > limit) return null;
  if (request.body === null) return new Uint8Array();
  const reader = request.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.length;
    if (size > limit) {
      await reader.cancel();
      return null;
    }
    chunks.push(value);
  }
  const body = new Uint8Array(size);
  let offset = 0;
  for (const chunk of chunks) {
    body.set(chunk, offset);
    offset += chunk.length;
  }
  return body;
}

/**
 * A fetch handler answering `ductor`'s bridge endpoint. By default it answers
 * on any path (the framework's route decides); give `path` to answer 404 elsewhere.
 */
export function fetchHandler(ductor: BridgeHost, options: AdapterOptions = {}): (request: Request) => Promise<Response> {
  const { path = null, maxBodyBytes = MAX_BODY_BYTES } = options;
  return async (request) => {
    const url = new URL(request.url);
    if (path !== null && (url.pathname.replace(/\/+$/, "") || "/") !== (path.replace(/\/+$/, "") || "/")) {
      return new Response("not found", { status: 404, headers: { "content-type": "text/plain" } });
    }
    const body = await readLimited(request, maxBodyBytes);
    if (body === null) return new Response("body too large", { status: 413, headers: { "content-type": "text/plain" } });
    const answer = await ductor.handle({
      method: request.method,
      headers: request.headers,
      body,
      url: `${url.origin}${url.pathname}`,
    });
    return new Response(answer.body as Uint8Array<ArrayBuffer>, { status: answer.status, headers: answer.headers });
  };
}
