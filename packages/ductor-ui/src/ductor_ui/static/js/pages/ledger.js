// The ledger: every account's balances, and the entries (all, or one account's), paged.

import { api } from "../api.js";
import { errorBox, field, fill, fmtMicros, h, section, select, table, timeEl } from "../dom.js";
import { Pager } from "../pager.js";

export async function render(main, ctx) {
  ctx.title("Ledger");
  const accounts = await api("/v1/accounts");
  if (!ctx.current()) return;
  const currencyOf = new Map(accounts.map((a) => [a.code, a.currency]));
  const account = select([["", "All accounts"], ...accounts.map((a) => [a.code, a.code])], ctx.query.get("account") || "", { name: "account" });
  const entriesEl = h("div", { id: "entries" });
  const pager = new Pager(() => load(), "Entry pages");
  const load = async () => {
    try {
      const page = await api("/v1/ledger/entries", { query: { account: account.value, cursor: pager.cursor, limit: 25 } });
      if (!ctx.current()) return;
      fill(
        entriesEl,
        table(
          [
            { label: "Entry", cell: (e) => h("span", { class: "mono" }, e.id) },
            { label: "At", cell: (e) => timeEl(e.created_at) },
            { label: "Description", cell: (e) => [e.description, e.reverses ? ` (reverses ${e.reverses})` : "", e.corrects ? ` (corrects ${e.corrects})` : ""] },
            {
              label: "Postings",
              cell: (e) =>
                h(
                  "ul", { class: "postings" },
                  e.postings.map((p) =>
                    h("li", {}, h("span", { class: "mono" }, p.account), " ", h("span", { class: p.amount < 0 ? "credit" : "debit" }, `${p.amount < 0 ? "credit" : "debit"} ${fmtMicros(p.amount < 0 ? -p.amount : p.amount, p.currency || currencyOf.get(p.account) || "")}`)),
                  ),
                ),
            },
          ],
          page.items,
          { caption: "Entries, newest first", empty: "No entries." },
        ),
      );
      pager.shown(page.next_cursor, page.items.length);
    } catch (err) {
      fill(entriesEl, errorBox(err));
    }
  };
  account.addEventListener("change", () => {
    pager.reset();
    load();
  });
  fill(
    main,
    h("h1", {}, "Ledger"),
    section(
      "Balances",
      table(
        [
          { label: "Account", cell: (a) => h("span", { class: "mono" }, a.code) },
          { label: "Name", cell: (a) => a.name || "" },
          { label: "Kind", cell: (a) => a.kind },
          { label: "Balance", cell: (a) => fmtMicros(a.balance, a.currency), class: "num" },
          { label: "Pending", cell: (a) => fmtMicros(a.pending, a.currency), class: "num" },
          { label: "Available", cell: (a) => fmtMicros(a.available, a.currency), class: "num" },
          { label: "Floor", cell: (a) => (a.floor === null || a.floor === undefined ? "none" : fmtMicros(a.floor, a.currency)), class: "num" },
        ],
        accounts,
        { caption: "Accounts and their balances (in their normal direction)", empty: "No accounts are open yet." },
      ),
    ),
    section(
      "Entries",
      h("form", { class: "inline-form", "aria-label": "Filter entries", onSubmit: (e) => e.preventDefault() }, field("Account", account).row),
      entriesEl,
      pager.el,
    ),
  );
  await load();
}
