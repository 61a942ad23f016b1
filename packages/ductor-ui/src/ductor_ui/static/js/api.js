// The one way the dashboard reaches the server: the public REST API, with the
// API key the user signed in with. The key lives in sessionStorage only (gone
// when the tab closes), never in a URL, a cookie or persistent storage.

const KEY = "ductor.api_key";

export class ApiError extends Error {
  constructor(status, body) {
    const message = body && body.message ? body.message : `HTTP ${status}`;
    super(message);
    this.status = status;
    this.code = body && body.code ? body.code : `http.${status}`;
    this.details = body && body.details ? body.details : null;
  }
}

export function getKey() {
  return window.sessionStorage.getItem(KEY);
}

export function setKey(key) {
  window.sessionStorage.setItem(KEY, key);
}

export function clearKey() {
  window.sessionStorage.removeItem(KEY);
}

const listeners = new Set();
/** Called with no argument when the server refuses the key (401). */
export function onUnauthenticated(fn) {
  listeners.add(fn);
}

/** A fresh Idempotency-Key: one per form submission, so a double click acts once. */
export function idempotencyKey() {
  return `ui-${window.crypto.randomUUID()}`;
}

/**
 * Call the API: api("/v1/runs", {query: {status}}) or api("/v1/runs", {method: "POST", body}).
 * Resolves to the decoded JSON (null for 204); rejects with an ApiError.
 */
export async function api(path, { method = "GET", body, query, key, idempotency } = {}) {
  const url = new URL(path, window.location.origin);
  for (const [name, value] of Object.entries(query || {})) {
    if (value !== null && value !== undefined && value !== "") url.searchParams.set(name, String(value));
  }
  const apiKey = key || getKey();
  const headers = { Accept: "application/json" };
  if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (idempotency) headers["Idempotency-Key"] = idempotency;
  let response;
  try {
    response = await window.fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      redirect: "error",
    });
  } catch (exc) {
    throw Object.assign(new Error(`the server could not be reached (${exc.message})`), { code: "network.unreachable" });
  }
  if (response.status === 204) return null;
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = { code: "response.not_json", message: text.slice(0, 300) };
    }
  }
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    if (response.status === 401 && !key) {
      clearKey();
      for (const fn of listeners) fn();
    }
    throw error;
  }
  return data;
}

let paths = null;
/**
 * The API paths this server documents (from its public OpenAPI document), so a page
 * whose API is absent is not offered. Resolves to null when the document cannot be read.
 */
export async function apiPaths() {
  if (paths !== null) return paths;
  try {
    const response = await window.fetch("/docs/openapi.json", { cache: "no-store", credentials: "omit" });
    paths = response.ok ? new Set(Object.keys((await response.json()).paths || {})) : undefined;
  } catch {
    paths = undefined;
  }
  return paths;
}
