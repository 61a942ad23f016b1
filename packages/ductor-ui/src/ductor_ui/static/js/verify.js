// Verifying a receipt in the browser, as `ductor receipts verify` does offline:
// the DSSE envelope's Ed25519 signature over PAE(type, payload) by a key of the
// server's public key set (/.well-known/ductor-keys), the payload type, the
// payload in canonical JSON (RFC 8785), and the digest the API lists.

export const RECEIPT_PAYLOAD_TYPE = "application/vnd.ductor.receipt+json";

function b64decode(text) {
  let s = String(text).replace(/-/g, "+").replace(/_/g, "/").replace(/=+$/, "");
  while (s.length % 4) s += "=";
  const raw = window.atob(s);
  return Uint8Array.from(raw, (c) => c.charCodeAt(0));
}

const utf8 = new TextEncoder();

/** DSSEv1 pre-authentication encoding: "DSSEv1 LEN(type) type LEN(body) body". */
export function pae(type, body) {
  const t = utf8.encode(type);
  const head = utf8.encode(`DSSEv1 ${t.length} ${type} ${body.length} `);
  const out = new Uint8Array(head.length + body.length);
  out.set(head, 0);
  out.set(body, head.length);
  return out;
}

/** RFC 8785 canonical JSON of a parsed value (keys by UTF-16 code units, ES number form). */
export function canonical(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(canonical).join(",")}]`;
  const keys = Object.keys(value).sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(value[k])}`).join(",")}}`;
}

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Check `receipt` (the API's receipt view) against `keySet` (a JWK Set).
 * Resolves to {ok, checks: [{name, ok, detail}]}; never throws for a bad receipt.
 */
export async function verifyReceipt(receipt, keySet) {
  const checks = [];
  const check = (name, ok, detail = "") => {
    checks.push({ name, ok, detail });
    return ok;
  };
  const envelope = receipt.envelope || {};
  let payload;
  try {
    payload = b64decode(envelope.payload || "");
  } catch {
    check("payload is base64", false);
    return { ok: false, checks };
  }
  check("payload type", envelope.payloadType === RECEIPT_PAYLOAD_TYPE, envelope.payloadType);
  const keys = new Map((keySet.keys || []).filter((k) => k.kty === "OKP" && k.crv === "Ed25519").map((k) => [k.kid, k]));
  let signed = false;
  let signer = "";
  for (const signature of envelope.signatures || []) {
    const jwk = keys.get(signature.keyid);
    if (!jwk) continue;
    try {
      const key = await window.crypto.subtle.importKey("jwk", { kty: "OKP", crv: "Ed25519", x: jwk.x }, { name: "Ed25519" }, false, ["verify"]);
      if (await window.crypto.subtle.verify({ name: "Ed25519" }, key, b64decode(signature.sig), pae(envelope.payloadType || "", payload))) {
        signed = true;
        signer = signature.keyid;
        break;
      }
    } catch (exc) {
      check(`signature by ${signature.keyid}`, false, exc.message);
    }
  }
  const keyids = (envelope.signatures || []).map((s) => s.keyid).join(", ");
  check("signature by a published key", signed, signed ? `key ${signer}` : `signed by ${keyids || "nobody"}; published: ${[...keys.keys()].join(", ") || "none"}`);
  const text = new TextDecoder().decode(payload);
  let parsed = null;
  try {
    parsed = JSON.parse(text);
    check("payload is canonical JSON (RFC 8785)", canonical(parsed) === text);
  } catch (exc) {
    check("payload is JSON", false, exc.message);
  }
  const digest = `sha256:${hex(await window.crypto.subtle.digest("SHA-256", payload))}`;
  check("digest matches", digest === receipt.digest, digest);
  if (parsed) check("payload is this receipt", parsed.id === receipt.id, parsed.id);
  return { ok: checks.every((c) => c.ok), checks };
}
