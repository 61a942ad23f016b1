// examples/docs/register.ts
import { Ductor } from "@ductor/sdk";

export async function register(): Promise<void> {
  const ductor = new Ductor({
    appId: "billing",
    signingKey: "dsk_…", // the app's own key (POST /v1/bridge/apps/billing/keys)
    fallbackSigningKey: "dsk_previous…", // during a rotation: still accepted, never used to sign
    serverUrl: "https://ductor.internal",
    apiKey: "…",
    url: "https://billing.internal/api/ductor", // where the server reaches this app
  });
  const ack = await ductor.sync(); // POST /v1/bridge/sync with the describe payload
  console.log("registered:", ack.accepted);
}
