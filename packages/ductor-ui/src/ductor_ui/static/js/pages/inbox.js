// A subscriber's inbox, as the tenant sees it (the tenant-side API): by feed and status, paged.

import { api } from "../api.js";
import { errorBox, field, fill, h, link, section, select, table, timeEl } from "../dom.js";
import { Pager } from "../pager.js";

const STATUSES = [["all", "All"], ["unseen", "Unseen"], ["unread", "Unread"], ["archived", "Archived"], ["snoozed", "Snoozed"]];

function flags(n) {
  const out = [];
  out.push(n.read ? "read" : n.seen ? "seen" : "new");
  if (n.archived) out.push("archived");
  if (n.snoozed_until) out.push("snoozed");
  if (n.acted) out.push("acted");
  return out.join(", ");
}

export async function render(main, ctx) {
  ctx.title("Inbox");
  const subscriber = h("input", { type: "text", name: "subscriber", required: true, autocomplete: "off", value: ctx.query.get("subscriber") || "" });
  const feed = h("input", { type: "text", name: "feed", autocomplete: "off", placeholder: "any feed" });
  const status = select(STATUSES, "all", { name: "status" });
  const listEl = h("div", { id: "inbox-list" });
  const pager = new Pager(() => load(), "Notification pages");
  const load = async () => {
    if (!subscriber.value.trim()) {
      fill(listEl, h("p", { class: "empty" }, "Enter a subscriber id to see their inbox."));
      return;
    }
    try {
      const page = await api("/v1/inbox/notifications", {
        query: { subscriber_id: subscriber.value.trim(), feed: feed.value.trim(), status: status.value, cursor: pager.cursor, limit: 25 },
      });
      if (!ctx.current()) return;
      fill(
        listEl,
        table(
          [
            { label: "Title", cell: (n) => h("strong", {}, n.title) },
            { label: "Body", cell: (n) => n.body },
            { label: "Feed", cell: (n) => n.feed },
            { label: "State", cell: (n) => flags(n) },
            { label: "Actions", cell: (n) => (n.ctas || []).map((c) => c.label).join(", ") },
            { label: "From run", cell: (n) => (n.run_id ? link(`#/runs/${encodeURIComponent(n.run_id)}`, n.workflow || n.run_id) : "") },
            { label: "At", cell: (n) => timeEl(n.created_at) },
          ],
          page.notifications,
          { caption: `Notifications of ${subscriber.value.trim()}, newest first`, empty: "No notifications match." },
        ),
      );
      pager.shown(page.next_cursor, page.notifications.length);
    } catch (err) {
      fill(listEl, errorBox(err));
    }
  };
  const form = h(
    "form", { class: "filters", "aria-label": "Choose an inbox" },
    field("Subscriber id", subscriber).row,
    field("Feed", feed).row,
    field("Status", status).row,
    h("button", { type: "submit" }, "Show inbox"),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    window.history.replaceState(null, "", `#/inbox?subscriber=${encodeURIComponent(subscriber.value.trim())}`);
    pager.reset();
    load();
  });
  fill(main, h("h1", {}, "Inbox"), form, section("Notifications", listEl, pager.el));
  await load();
}
