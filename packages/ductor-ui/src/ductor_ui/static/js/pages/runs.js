// Runs: newest first, filtered by status, family and age, paged, live on page one.

import { api } from "../api.js";
import { badge, errorBox, field, fill, fmtDuration, h, link, select, table, timeEl } from "../dom.js";
import { Pager } from "../pager.js";
import { keepFocus } from "../focus.js";

const STATUSES = [
  ["", "Any status"],
  ["RUN_STATUS_PENDING", "Pending"],
  ["RUN_STATUS_RUNNING", "Running"],
  ["RUN_STATUS_SUCCEEDED", "Succeeded"],
  ["RUN_STATUS_FAILED", "Failed"],
  ["RUN_STATUS_CANCELLED", "Cancelled"],
];

const SINCE = [
  ["", "Any time"],
  ["15m", "Last 15 minutes"],
  ["1h", "Last hour"],
  ["24h", "Last 24 hours"],
  ["7d", "Last 7 days"],
];
const SINCE_MS = { "15m": 9e5, "1h": 36e5, "24h": 864e5, "7d": 6048e5 };
const PAGE_SIZE = 25;

export function runColumns() {
  return [
    { label: "Run", cell: (r) => link(`#/runs/${encodeURIComponent(r.id)}`, r.id, { class: "mono" }) },
    { label: "Workflow", cell: (r) => `${r.family_slug} v${r.version}` },
    { label: "Status", cell: (r) => badge(r.status) },
    { label: "Started", cell: (r) => timeEl(r.created_at) },
    { label: "Ended", cell: (r) => timeEl(r.finished_at) },
    {
      label: "Took",
      cell: (r) => (r.finished_at ? fmtDuration(new Date(r.finished_at) - new Date(r.created_at)) : ""),
      class: "num",
    },
  ];
}

export async function render(main, ctx) {
  ctx.title("Runs");
  const q = ctx.query;
  const status = select(STATUSES, q.get("status") || "", { name: "status" });
  // The family the address names is an option from the start, so the select alone
  // says which family to show, before the list of families arrives and after.
  const named = q.get("family") || "";
  const family = select([["", "Any workflow"], ...(named ? [[named, named]] : [])], named, { name: "family" });
  const since = select(SINCE, q.get("since") || "", { name: "since" });
  const live = h("input", { type: "checkbox", id: "runs-live", checked: true });
  const listEl = h("div", { id: "runs-list", "aria-busy": "true" });
  const pager = new Pager(() => load(), "Run pages");

  fill(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Runs"), h("a", { href: "#/workflows", class: "button" }, "Trigger a workflow")),
    h(
      "form", { class: "filters", "aria-label": "Filter runs", onSubmit: (e) => e.preventDefault() },
      field("Status", status).row,
      field("Workflow", family).row,
      field("Started", since).row,
      h("div", { class: "field checkbox" }, live, h("label", { for: "runs-live" }, "Live updates")),
    ),
    listEl,
    pager.el,
  );

  api("/v1/workflows").then((families) => {
    const current = family.value;
    const slugs = families.map((f) => f.family_slug);
    if (named && !slugs.includes(named)) slugs.push(named);
    fill(family, h("option", { value: "" }, "Any workflow"), slugs.map((slug) => h("option", { value: slug }, slug)));
    family.value = current;
  }).catch(() => {});

  const onFilter = () => {
    const params = new URLSearchParams();
    if (status.value) params.set("status", status.value);
    if (family.value) params.set("family", family.value);
    if (since.value) params.set("since", since.value);
    const query = params.toString();
    window.history.replaceState(null, "", `#/runs${query ? `?${query}` : ""}`);
    pager.reset();
    load();
  };
  for (const el of [status, family, since]) el.addEventListener("change", onFilter);

  // The rows last drawn: a refresh that brings the same rows leaves the table as it is,
  // so a reader's text selection (a run id being copied) survives it.
  let drawn = null;

  async function load() {
    let page;
    try {
      page = await api("/v1/runs", {
        query: { status: status.value, family_slug: family.value, cursor: pager.cursor, limit: PAGE_SIZE },
      });
    } catch (err) {
      drawn = null;
      fill(listEl, errorBox(err));
      return;
    }
    if (!ctx.current()) return;
    let items = page.items;
    let next = page.next_cursor;
    const window_ = SINCE_MS[since.value];
    if (window_) {
      // Runs come newest first: past the first one older than the window, none is newer.
      const cutoff = Date.now() - window_;
      const kept = items.filter((r) => new Date(r.created_at).getTime() >= cutoff);
      if (kept.length < items.length) next = null;
      items = kept;
    }
    const rows = JSON.stringify(items);
    if (rows !== drawn) {
      drawn = rows;
      keepFocus(listEl, () =>
        fill(
          listEl,
          table(runColumns(), items, {
            caption: "Runs, newest first",
            empty: "No runs match these filters.",
            rowKey: (r) => r.id,
          }),
        ),
      );
    }
    listEl.setAttribute("aria-busy", "false");
    pager.shown(next, items.length);
  }

  await load();
  ctx.every(2000, async () => {
    if (live.checked && pager.first) await load();
  });
}
