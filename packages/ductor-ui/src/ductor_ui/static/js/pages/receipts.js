// Receipts: newest first, by kind or subject, paged.

import { api } from "../api.js";
import { errorBox, field, fill, h, link, section, select, table, timeEl } from "../dom.js";
import { Pager } from "../pager.js";

export async function render(main, ctx) {
  ctx.title("Receipts");
  const kind = select([["", "Any kind"], ["run", "Runs"], ["assignment", "Assignments"]], "", { name: "kind" });
  const subject = h("input", { type: "text", name: "subject", autocomplete: "off", placeholder: "run:run_… or assignment:asg_…" });
  const listEl = h("div", { id: "receipts-list" });
  const pager = new Pager(() => load(), "Receipt pages");
  const load = async () => {
    try {
      const page = await api("/v1/receipts", { query: { kind: kind.value, subject: subject.value.trim(), cursor: pager.cursor, limit: 25 } });
      if (!ctx.current()) return;
      fill(
        listEl,
        table(
          [
            { label: "Receipt", cell: (r) => link(`#/receipts/${encodeURIComponent(r.id)}`, r.id, { class: "mono" }) },
            { label: "Subject", cell: (r) => (r.subject.kind === "run" ? [`run `, link(`#/runs/${encodeURIComponent(r.subject.id)}`, r.subject.id)] : `${r.subject.kind} ${r.subject.id}`) },
            { label: "Cost", cell: (r) => (r.receipt.cost ? `${r.receipt.cost.micros} micros ${r.receipt.cost.currency}` : ""), class: "num" },
            { label: "Signed by", cell: (r) => h("span", { class: "mono" }, r.key_id) },
            { label: "Issued", cell: (r) => timeEl(r.created_at) },
          ],
          page.items,
          { caption: "Receipts, newest first", empty: "No receipts match." },
        ),
      );
      pager.shown(page.next_cursor, page.items.length);
    } catch (err) {
      fill(listEl, errorBox(err));
    }
  };
  const form = h(
    "form", { class: "filters", "aria-label": "Filter receipts" },
    field("Kind", kind).row,
    field("Subject", subject).row,
    h("button", { type: "submit", class: "secondary" }, "Filter"),
  );
  const refilter = (event) => {
    if (event) event.preventDefault();
    pager.reset();
    load();
  };
  form.addEventListener("submit", refilter);
  kind.addEventListener("change", () => refilter());
  fill(main, h("h1", {}, "Receipts"), form, section("Issued receipts", listEl, pager.el));
  await load();
}
