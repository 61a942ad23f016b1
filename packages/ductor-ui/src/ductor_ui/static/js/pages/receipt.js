// One receipt: its payload, its envelope, and a button that verifies it here,
// in the browser, against the server's published keys.

import { api } from "../api.js";
import { fill, h, jsonBlock, section, timeEl, errorBox } from "../dom.js";
import { verifyReceipt } from "../verify.js";

export async function render(main, ctx) {
  const id = ctx.params[0];
  ctx.title(`Receipt ${id}`);
  const receipt = await api(`/v1/receipts/${encodeURIComponent(id)}`);
  if (!ctx.current()) return;
  const result = h("div", { id: "verify-result", "aria-live": "polite" });
  const button = h("button", { type: "button" }, "Verify signature");
  button.addEventListener("click", async () => {
    button.disabled = true;
    fill(result, h("p", {}, "Verifying…"));
    try {
      const keys = await api("/.well-known/ductor-keys");
      const verdict = await verifyReceipt(receipt, keys);
      fill(
        result,
        h("p", { class: verdict.ok ? "ok verdict" : "error verdict", role: "status" }, verdict.ok ? "✓ Verified: this receipt is authentic and unchanged." : "✗ Not verified: see the failed checks."),
        h(
          "ul", { class: "checks" },
          verdict.checks.map((c) => h("li", { class: c.ok ? "yes" : "no" }, `${c.ok ? "✓" : "✗"} ${c.name}`, c.detail ? h("span", { class: "hint" }, ` ${c.detail}`) : "")),
        ),
      );
    } catch (err) {
      fill(result, errorBox(err));
    } finally {
      button.disabled = false;
    }
  });
  const subject = receipt.subject;
  fill(
    main,
    h("h1", {}, "Receipt ", h("span", { class: "mono" }, id)),
    h(
      "dl", { class: "meta" },
      h("dt", {}, "Subject"), h("dd", {}, subject.kind === "run" ? h("a", { href: `#/runs/${encodeURIComponent(subject.id)}` }, `run ${subject.id}`) : `${subject.kind} ${subject.id}`),
      h("dt", {}, "Issued"), h("dd", {}, timeEl(receipt.created_at)),
      h("dt", {}, "Signed by key"), h("dd", { class: "mono" }, receipt.key_id),
      h("dt", {}, "Digest"), h("dd", { class: "mono hash" }, receipt.digest),
    ),
    h("section", { class: "panel", "aria-labelledby": "verify-title" }, h("h2", { id: "verify-title" }, "Verify"), h("p", { class: "hint" }, "Checks the Ed25519 signature against the keys at /.well-known/ductor-keys, the payload's canonical form and its digest, in this browser (as ductor receipts verify does offline)."), button, result),
    section("Receipt", jsonBlock(receipt.receipt, "Receipt payload")),
    section("Signed envelope (DSSE)", jsonBlock(receipt.envelope, "Signed envelope")),
  );
}
