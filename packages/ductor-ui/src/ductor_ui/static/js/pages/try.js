// Route a routable from a form and show the decision's explanation. The API has
// no dry run: this is a real decision (POST /v1/route), assignment included.

import { api, idempotencyKey } from "../api.js";
import { errorBox, field, fill, h, parseJson } from "../dom.js";
import { explanationView } from "./decision.js";

export async function render(main, ctx) {
  ctx.title("Try a routable");
  const id = h("input", { type: "text", name: "id", required: true, autocomplete: "off", value: `ui-${Date.now()}` });
  const kind = h("input", { type: "text", name: "kind", required: true, autocomplete: "off", value: "lead" });
  const attributes = h("textarea", { name: "attributes", rows: "6", spellcheck: "false", class: "code-input" }, '{\n  "state": "CA"\n}');
  const pool = h("input", { type: "text", name: "pool", autocomplete: "off", placeholder: "optional: skip the rules" });
  const price = h("input", { type: "number", name: "price", step: "1", min: "0", placeholder: "optional, in micros" });
  const result = h("div", { id: "try-result" });
  const button = h("button", { type: "submit" }, "Route it");
  let key = idempotencyKey();
  const form = h(
    "form", { class: "stack-form", "aria-labelledby": "try-title" },
    h("p", { class: "notice" }, "This makes a real routing decision: an assigned routable reserves the worker's capacity and, in a settled pool, charges it. Use a test kind or pool to experiment."),
    h("div", { class: "two-col" }, field("Routable id", id).row, field("Kind", kind).row),
    field("Attributes (JSON)", attributes).row,
    h("div", { class: "two-col" }, field("Pool", pool).row, field("Price", price).row),
    button,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    button.disabled = true;
    try {
      const body = { id: id.value, kind: kind.value, attributes: parseJson(attributes.value, "The attributes") || {} };
      if (pool.value) body.pool = pool.value;
      if (price.value) body.price = Number(price.value);
      const decision = await api("/v1/route", { method: "POST", body, idempotency: key });
      key = idempotencyKey();
      id.value = `ui-${Date.now()}`;
      fill(
        result,
        h("h2", {}, "Decision ", h("a", { href: `#/decisions/${encodeURIComponent(decision.id)}`, class: "mono" }, decision.id)),
        explanationView(decision),
      );
    } catch (err) {
      fill(result, errorBox(err));
    } finally {
      button.disabled = false;
    }
  });
  fill(main, h("h1", { id: "try-title" }, "Try a routable"), form, result);
}
