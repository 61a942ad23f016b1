/**
 * Node's `http` adapter: serve a {@link Ductor}'s bridge endpoint from a
 * `node:http` server (or anything taking a `(req, res)` request listener).
 */

import { type IncomingMessage, type Server, type ServerResponse, createServer } from "node:http";

import type { BridgeHost, BridgeResponse } from "../client.js";
import { BRIDGE_PATH } from "../protocol.js";

/** Requests above this size are refused (413) before any work is done. */
export const MAX_BODY_BYTES = 64 * 1024 * 1024;

/** Options of the adapters. */
export interface AdapterOptions {
  /** Where the endpoint lives; `null` answers on every path (for mounting). */
  readonly path?: string | null;
  /** The largest request body accepted (default {@link MAX_BODY_BYTES}). */
  readonly maxBodyBytes?: number;
}

/** A request body over the limit. */
export class BodyTooLarge extends Error {
  override readonly name = "BodyTooLarge";
}

/** Read a Node request stream whole, refusing more than `limit` bytes. */
export async function readBody(stream: AsyncIterable<Uint8Array | string>, limit: number): Promise<Uint8Array> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of stream) {
    const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : Buffer.from(chunk);
    size += bytes.length;
    if (size > limit) throw new BodyTooLarge(`body larger than ${limit} bytes`);
    chunks.push(bytes);
  }
  return new Uint8Array(Buffer.concat(chunks, size));
}

function normal(path: string): string {
  return path.replace(/\/+$/, "") || "/";
}

/** Whether `url` (a request's path and query) is the endpoint's path. */
export function onPath(url: string | undefined, path: string | null): boolean {
  if (path === null) return true;
  const pathname = (url ?? "/").split("?", 1)[0] ?? "/";
  return normal(pathname) === normal(path);
}

/** Send a {@link BridgeResponse} on a Node response. */
export function send(res: ServerResponse, answer: BridgeResponse): void {
  res.writeHead(answer.status, { ...answer.headers, "content-length": String(answer.body.length) });
  res.end(answer.body);
}

function plain(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { "content-type": "text/plain", "content-length": String(Buffer.byteLength(text)) });
  res.end(text);
}

/** The URL a Node request reached. */
export function requestUrl(req: IncomingMessage): string {
  const host = req.headers.host ?? `${req.socket.localAddress ?? "127.0.0.1"}:${req.socket.localPort ?? 80}`;
  const encrypted = (req.socket as { encrypted?: boolean }).encrypted === true;
  return `${encrypted ? "https" : "http"}://${host}${(req.url ?? "/").split("?", 1)[0] ?? "/"}`;
}

/** Answer one Node request with `ductor` (the body is read from the request stream). */
export async function handleNode(
  ductor: BridgeHost,
  req: IncomingMessage,
  res: ServerResponse,
  options: AdapterOptions & { readonly body?: Uint8Array } = {},
): Promise<void> {
  const { maxBodyBytes = MAX_BODY_BYTES } = options;
  let body = options.body;
  if (body === undefined) {
    try {
      body = await readBody(req, maxBodyBytes);
    } catch (err) {
      if (err instanceof BodyTooLarge) {
        plain(res, 413, "body too large");
        req.resume();
        return;
      }
      throw err;
    }
  } else if (body.length > maxBodyBytes) {
    plain(res, 413, "body too large");
    return;
  }
  const answer = await ductor.handle({ method: req.method ?? "GET", headers: req.headers, body, url: requestUrl(req) });
  send(res, answer);
}

/**
 * A `node:http` request listener answering `ductor`'s bridge endpoint at
 * `path` (`/api/ductor` by default) and 404 elsewhere.
 */
export function nodeHandler(
  ductor: BridgeHost,
  options: AdapterOptions = {},
): (req: IncomingMessage, res: ServerResponse) => void {
  const path = options.path === undefined ? BRIDGE_PATH : options.path;
  return (req, res) => {
    if (!onPath(req.url, path)) {
      plain(res, 404, "not found");
      req.resume();
      return;
    }
    handleNode(ductor, req, res, options).catch((err: unknown) => {
      if (!res.headersSent) plain(res, 500, `internal error: ${String(err)}`);
      else res.destroy();
    });
  };
}

/** A `node:http` server serving only `ductor`'s bridge endpoint (call `.listen(port)`). */
export function createBridgeServer(ductor: BridgeHost, options: AdapterOptions = {}): Server {
  return createServer(nodeHandler(ductor, options));
}
