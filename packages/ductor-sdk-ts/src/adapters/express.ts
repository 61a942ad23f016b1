/**
 * Express adapter: `app.all("/api/ductor", ductorExpress(ductor))`.
 *
 * Signatures cover the raw body, so mount it before any body parser, or after
 * `express.raw({ type: "application/json" })`; a body that `express.json()`
 * already parsed is refused (500, `bridge.body_parsed`) rather than
 * re-encoded. Typed structurally, so the SDK does not depend on Express.
 */

import type { IncomingMessage, ServerResponse } from "node:http";

import type { BridgeHost } from "../client.js";
import { BRIDGE_PATH } from "../protocol.js";
import { type AdapterOptions, handleNode, send } from "./node.js";
import { DuctorError } from "../errors.js";
import { ErrorResponse, SIGNATURE_HEADER, encode } from "../protocol.js";

/** The part of an Express request the adapter uses. */
export type ExpressRequestLike = IncomingMessage & { body?: unknown };

/** An Express middleware answering `ductor`'s bridge endpoint where it is mounted. */
export function ductorExpress(
  ductor: BridgeHost,
  options: AdapterOptions = {},
): (req: ExpressRequestLike, res: ServerResponse, next: (err?: unknown) => void) => void {
  return (req, res, next) => {
    let body: Uint8Array | undefined;
    if (req.body instanceof Uint8Array) body = req.body;
    else if (typeof req.body === "string") body = Buffer.from(req.body, "utf8");
    else if (req.body !== undefined && req.body !== null && req.readableEnded) {
      const error = new DuctorError(
        `a body parser consumed the request before the bridge saw it; mount ductorExpress() before express.json() or use express.raw() on ${BRIDGE_PATH}`,
        { code: "bridge.body_parsed" },
      );
      const payload = encode(ErrorResponse, { code: error.code, message: error.message, details: null, retryable: false });
      send(res, {
        status: 500,
        headers: {
          "content-type": "application/json",
          [SIGNATURE_HEADER]: ductor.keys.header(payload, Math.floor(Date.now() / 1000)),
        },
        body: payload,
      });
      return;
    }
    handleNode(ductor, req, res, { ...options, ...(body === undefined ? {} : { body }) }).catch(next);
  };
}
