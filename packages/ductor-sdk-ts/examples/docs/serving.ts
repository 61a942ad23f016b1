// examples/docs/serving.ts
import express from "express";
import { Hono } from "hono";

import { Ductor } from "@ductor/sdk";
import { ductorExpress } from "@ductor/sdk/express";
import { fetchHandler } from "@ductor/sdk/fetch";
import { ductorHono } from "@ductor/sdk/hono";
import { createBridgeServer, nodeHandler } from "@ductor/sdk/node";

const ductor = new Ductor({ appId: "billing", signingKey: process.env["DUCTOR_SIGNING_KEY"] ?? "signkey-dev-0001" });

// node:http: a server of its own (call .listen(8020)), or a listener for your server.
export const server = createBridgeServer(ductor); // answers on /api/ductor, 404 elsewhere
export const listener = nodeHandler(ductor, { path: "/api/ductor" });

// Express: mount it before express.json(); signatures cover the raw body.
export const app = express();
app.all("/api/ductor", ductorExpress(ductor));
app.use(express.json());

// Hono, and anything built on fetch (Bun.serve, Deno.serve, Next.js route handlers).
export const hono = new Hono();
hono.on(["GET", "POST"], "/api/ductor", ductorHono(ductor));
export const handler = fetchHandler(ductor); // app/api/ductor/route.ts: export { handler as GET, handler as POST }
