// Workflow families: each with its latest version.

import { api } from "../api.js";
import { fill, h, link, table, timeEl } from "../dom.js";

export async function render(main, ctx) {
  ctx.title("Workflows");
  const families = await api("/v1/workflows");
  if (!ctx.current()) return;
  fill(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Workflows"), h("a", { href: "#/workflows/new", class: "button" }, "Publish a workflow")),
    table(
      [
        { label: "Family", cell: (f) => link(`#/workflows/${encodeURIComponent(f.family_slug)}`, f.family_slug, { class: "mono" }) },
        { label: "Title", cell: (f) => f.title || "" },
        { label: "Latest version", cell: (f) => String(f.latest_version), class: "num" },
        { label: "Content hash", cell: (f) => h("span", { class: "mono hash" }, (f.latest_hash || "").slice(0, 19)) },
        { label: "Updated", cell: (f) => timeEl(f.updated_at) },
      ],
      families,
      { caption: "Workflow families", empty: "No workflow is published yet: publish one to start." },
    ),
  );
}
