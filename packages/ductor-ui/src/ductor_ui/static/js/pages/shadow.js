// A pool's shadow report as charts: how often each shadow strategy agreed with
// the live one, and who each would have picked; the numbers also as tables.

import { api } from "../api.js";
import { field, fill, h, link, section, select, table } from "../dom.js";

function agreementChart(strategies) {
  const labelW = 170;
  const barW = 420;
  const rowH = 34;
  const svg = h("svg:svg", {
    class: "chart", width: labelW + barW + 70, height: strategies.length * rowH + 30, role: "img",
    "aria-label": `Agreement with the live strategy: ${strategies.map((s) => `${s.strategy} ${Math.round(s.agreement_rate * 100)}%`).join(", ")}`,
  });
  strategies.forEach((s, i) => {
    const y = i * rowH + 6;
    const w = Math.max(1, s.agreement_rate * barW);
    svg.append(
      h("svg:text", { x: 0, y: y + 17, class: "chart-label" }, s.strategy.length > 22 ? `${s.strategy.slice(0, 21)}…` : s.strategy),
      h("svg:rect", { x: labelW, y, width: barW, height: rowH - 12, class: "track" }),
      h("svg:rect", { x: labelW, y, width: w, height: rowH - 12, class: "bar agree" }),
      h("svg:text", { x: labelW + barW + 6, y: y + 17, class: "chart-value" }, `${(s.agreement_rate * 100).toFixed(1)}%`),
    );
  });
  [0, 50, 100].forEach((pct) => {
    svg.append(h("svg:text", { x: labelW + (pct / 100) * barW, y: strategies.length * rowH + 24, class: "chart-axis", "text-anchor": pct === 0 ? "start" : pct === 100 ? "end" : "middle" }, `${pct}%`));
  });
  return svg;
}

function distributionChart(report) {
  const recipients = [...new Set([...Object.keys(report.live_distribution), ...Object.keys(report.shadow_distribution)])].sort();
  const max = Math.max(1, ...recipients.map((r) => Math.max(report.live_distribution[r] || 0, report.shadow_distribution[r] || 0)));
  const labelW = 140;
  const barW = 380;
  const group = 40;
  const svg = h("svg:svg", {
    class: "chart", width: labelW + barW + 60, height: recipients.length * group + 10, role: "img",
    "aria-label": `Picks per recipient, live ${report.live_strategy} against shadow ${report.strategy}`,
  });
  recipients.forEach((r, i) => {
    const y = i * group + 4;
    const live = report.live_distribution[r] || 0;
    const shadow = report.shadow_distribution[r] || 0;
    svg.append(
      h("svg:text", { x: 0, y: y + 20, class: "chart-label" }, r.length > 18 ? `${r.slice(0, 17)}…` : r),
      h("svg:rect", { x: labelW, y, width: Math.max(1, (live / max) * barW), height: 14, class: "bar live" }),
      h("svg:text", { x: labelW + (live / max) * barW + 4, y: y + 12, class: "chart-value" }, String(live)),
      h("svg:rect", { x: labelW, y: y + 16, width: Math.max(1, (shadow / max) * barW), height: 14, class: "bar shadow" }),
      h("svg:text", { x: labelW + (shadow / max) * barW + 4, y: y + 28, class: "chart-value" }, String(shadow)),
    );
  });
  return [
    h(
      "ul", { class: "legend", "aria-label": "Legend" },
      h("li", {}, h("span", { class: "swatch live", "aria-hidden": "true" }), `live (${report.live_strategy})`),
      h("li", {}, h("span", { class: "swatch shadow", "aria-hidden": "true" }), `shadow (${report.strategy})`),
    ),
    svg,
    table(
      [
        { label: "Recipient", cell: (r) => r },
        { label: "Live picks", cell: (r) => String(report.live_distribution[r] || 0), class: "num" },
        { label: "Shadow picks", cell: (r) => String(report.shadow_distribution[r] || 0), class: "num" },
      ],
      recipients,
      { caption: `Picks per recipient: ${report.live_strategy} and ${report.strategy}` },
    ),
  ];
}

export async function render(main, ctx) {
  const poolId = ctx.params[0];
  ctx.title(`Shadow report of ${poolId}`);
  const limit = select([["100", "last 100"], ["1000", "last 1,000"], ["10000", "last 10,000"]], ctx.query.get("limit") || "1000", { name: "limit" });
  const body = h("div", { id: "shadow-report" });
  const load = async () => {
    const report = await api(`/v1/pools/${encodeURIComponent(poolId)}/shadow-report`, { query: { limit: limit.value } });
    if (!ctx.current()) return;
    const strategies = report.strategies || [];
    fill(
      body,
      h("p", {}, `${report.decisions} decisions of pool ${report.pool} read.`),
      strategies.length
        ? [
            section(
              "Agreement with the live strategy",
              agreementChart(strategies),
              table(
                [
                  { label: "Shadow strategy", cell: (s) => s.strategy },
                  { label: "Live strategy", cell: (s) => s.live_strategy },
                  { label: "Decisions", cell: (s) => String(s.decisions), class: "num" },
                  { label: "Agreements", cell: (s) => String(s.agreements), class: "num" },
                  { label: "Agreement", cell: (s) => `${(s.agreement_rate * 100).toFixed(1)}%`, class: "num" },
                ],
                strategies,
                { caption: "Agreement per shadow strategy" },
              ),
            ),
            strategies.map((s) =>
              section(
                `Who ${s.strategy} would have picked`,
                distributionChart(s),
                h("h3", {}, "First disagreements"),
                table(
                  [
                    { label: "Decision", cell: (d) => link(`#/decisions/${encodeURIComponent(d.decision_id)}`, d.decision_id, { class: "mono" }) },
                    { label: "Routable", cell: (d) => d.routable_id },
                    { label: "Live pick", cell: (d) => d.live || "nobody" },
                    { label: "Shadow pick", cell: (d) => d.shadow || "nobody" },
                  ],
                  s.differences || [],
                  { caption: `Decisions where ${s.strategy} differed`, empty: "It never disagreed." },
                ),
              ),
            ),
          ]
        : h("p", { class: "empty" }, "No decision of this pool ran a shadow strategy yet."),
    );
  };
  limit.addEventListener("change", load);
  fill(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Shadow report of ", h("span", { class: "mono" }, poolId)), h("a", { href: "#/routing", class: "button secondary" }, "Back to routing")),
    h("form", { class: "inline-form", "aria-label": "How many decisions", onSubmit: (e) => e.preventDefault() }, field("Decisions read", limit).row),
    body,
  );
  await load();
}
