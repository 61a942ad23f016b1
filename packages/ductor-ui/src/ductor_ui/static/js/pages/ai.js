// AI requests through the proxy: model, tokens, cost and latency, paged; and the prices.

import { api } from "../api.js";
import { errorBox, fill, fmtMicros, h, link, section, table, timeEl } from "../dom.js";
import { Pager } from "../pager.js";

export async function render(main, ctx) {
  ctx.title("AI requests");
  const listEl = h("div", { id: "ai-list" });
  const pricesEl = h("div", {});
  const pager = new Pager(() => load(), "AI request pages");
  const load = async () => {
    try {
      const page = await api("/v1/ai/requests", { query: { cursor: pager.cursor, limit: 25 } });
      if (!ctx.current()) return;
      const total = page.items.reduce((sum, r) => sum + BigInt(r.cost_micros || 0), 0n);
      fill(
        listEl,
        h("p", {}, `Cost of the requests on this page: `, h("strong", {}, fmtMicros(total)), " (in the ledger's currency)"),
        table(
          [
            { label: "Request", cell: (r) => h("span", { class: "mono" }, r.id) },
            { label: "At", cell: (r) => timeEl(r.created_at) },
            { label: "Model", cell: (r) => r.model },
            { label: "Kind", cell: (r) => r.kind },
            { label: "Status", cell: (r) => h("span", { class: `badge status-${r.status === "ok" ? "succeeded" : "failed"}` }, r.status) },
            { label: "Tokens in / out", cell: (r) => `${r.tokens_in} / ${r.tokens_out}`, class: "num" },
            { label: "Cost", cell: (r) => (r.priced ? fmtMicros(r.cost_micros) : "not priced"), class: "num" },
            { label: "Latency", cell: (r) => `${Math.round(r.latency_ms)} ms`, class: "num" },
            { label: "Run", cell: (r) => (r.run_id ? link(`#/runs/${encodeURIComponent(r.run_id)}`, r.step_ref ? `${r.run_id} · ${r.step_ref}` : r.run_id) : "") },
          ],
          page.items,
          { caption: "Model calls, newest first", empty: "No AI requests yet." },
        ),
      );
      pager.shown(page.next_cursor, page.items.length);
    } catch (err) {
      fill(listEl, errorBox(err));
    }
  };
  fill(main, h("h1", {}, "AI requests"), section("Requests", listEl, pager.el), section("Prices", pricesEl));
  await load();
  try {
    const prices = await api("/v1/ai/prices");
    if (!ctx.current()) return;
    fill(
      pricesEl,
      table(
        [
          { label: "Model", cell: (p) => p.model },
          { label: "Input, per million tokens", cell: (p) => fmtMicros(p.input_per_million), class: "num" },
          { label: "Output, per million tokens", cell: (p) => fmtMicros(p.output_per_million), class: "num" },
          { label: "Updated", cell: (p) => timeEl(p.updated_at) },
        ],
        prices,
        { caption: "Prices per model", empty: "No prices set: requests are not priced." },
      ),
    );
  } catch (err) {
    fill(pricesEl, errorBox(err));
  }
}
