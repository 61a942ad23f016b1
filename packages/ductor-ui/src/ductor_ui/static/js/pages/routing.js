// Routing: workers, pools, the rule set and its versions, and recent decisions.

import { api } from "../api.js";
import { errorBox, field, fill, fmtMicros, h, jsonBlock, link, section, select, table, timeEl } from "../dom.js";

// GET /v1/assignments lists at most this many, oldest first, and has no cursor.
const ASSIGNMENTS_READ = 1000;
const DECISIONS_SHOWN = 50;

async function orEmpty(promise, fallback) {
  try {
    return await promise;
  } catch (err) {
    if (err.status === 404) return fallback;
    throw err;
  }
}

function ruleTable(ruleSet) {
  const rules = [...(ruleSet.rules || [])];
  return [
    table(
      [
        { label: "Rule", cell: (r) => h("span", { class: "mono" }, r.id) },
        { label: "Priority", cell: (r) => String(r.priority ?? 0), class: "num" },
        { label: "Match", cell: (r) => (r.match || []).map((m) => JSON.stringify(m)).join(", ") },
        { label: "When (CEL)", cell: (r) => (r.when ? h("code", {}, r.when) : "always") },
        { label: "Pool", cell: (r) => r.pool },
      ],
      rules,
      { caption: `Rules of ${ruleSet.id}, in priority order`, empty: "No rules: everything goes to the default pool." },
    ),
    h("p", {}, "Default pool: ", ruleSet.default_pool ? h("strong", {}, ruleSet.default_pool) : "none"),
  ];
}

export async function render(main, ctx) {
  ctx.title("Routing");
  const [workers, pools, rules, versions, assignments] = await Promise.all([
    api("/v1/workers"),
    api("/v1/pools"),
    orEmpty(api("/v1/rules"), null),
    orEmpty(api("/v1/rules/versions"), []),
    // Assignments come oldest first: read as many as the API gives, show the newest.
    api("/v1/assignments", { query: { limit: ASSIGNMENTS_READ } }),
  ]);
  const latest = assignments.slice(-DECISIONS_SHOWN).reverse();
  if (!ctx.current()) return;

  const lookup = h("input", { type: "text", name: "decision", required: true, autocomplete: "off", class: "mono" });
  const lookupForm = h(
    "form", { class: "inline-form", "aria-label": "Open a decision by id" },
    field("Decision id", lookup).row,
    h("button", { type: "submit" }, "Open decision"),
  );
  lookupForm.addEventListener("submit", (event) => {
    event.preventDefault();
    if (lookup.value.trim()) ctx.navigate(`#/decisions/${encodeURIComponent(lookup.value.trim())}`);
  });

  const ruleView = h("div", { id: "rules-view" });
  const versionSelect = select(
    versions.map((v) => [String(v.version), `version ${v.version}${rules && v.version === rules.version ? " (in force)" : ""}`]),
    rules ? String(rules.version) : "",
    { name: "rules-version" },
  );
  const showRules = async () => {
    try {
      const chosen = Number(versionSelect.value);
      const view = rules && chosen === rules.version ? rules : await api(`/v1/rules/versions/${chosen}`);
      fill(
        ruleView,
        h("p", { class: "hint" }, `Version ${view.version}, published `, timeEl(view.created_at)),
        ruleTable(view.rule_set),
        h("details", {}, h("summary", {}, "The whole rule set (kinds, enrichers)"), jsonBlock(view.rule_set, "Rule set")),
      );
    } catch (err) {
      fill(ruleView, errorBox(err));
    }
  };
  versionSelect.addEventListener("change", showRules);

  fill(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Routing"), h("a", { href: "#/routing/try", class: "button" }, "Try a routable")),
    section(
      "Decisions",
      lookupForm,
      table(
        [
          { label: "Decision", cell: (a) => link(`#/decisions/${encodeURIComponent(a.decision_id)}`, a.decision_id, { class: "mono" }) },
          { label: "Routable", cell: (a) => a.routable_id },
          { label: "Pool", cell: (a) => a.pool },
          { label: "Worker", cell: (a) => a.worker },
          { label: "Status", cell: (a) => a.status },
          { label: "Charge", cell: (a) => (a.charge ? fmtMicros(a.charge) : ""), class: "num" },
          { label: "At", cell: (a) => timeEl(a.created_at) },
        ],
        latest,
        { caption: "Latest decisions that assigned work, newest first (the API lists decisions through their assignments)", empty: "No assignments yet." },
      ),
    ),
    section(
      "Pools",
      table(
        [
          { label: "Pool", cell: (p) => h("span", { class: "mono" }, p.id) },
          { label: "Strategy", cell: (p) => p.strategy.label || p.strategy.name },
          { label: "Shadows", cell: (p) => (p.shadows || []).map((s) => s.label || s.name).join(", ") || "none" },
          { label: "Members", cell: (p) => (p.members || []).map((m) => m.worker).join(", ") },
          { label: "Channel", cell: (p) => p.channel },
          {
            label: "Shadow report",
            cell: (p) => ((p.shadows || []).length ? link(`#/routing/pools/${encodeURIComponent(p.id)}/shadow`, `Shadow report of ${p.id}`) : ""),
          },
        ],
        pools,
        { caption: "Pools", empty: "No pools yet." },
      ),
    ),
    section(
      "Workers",
      table(
        [
          { label: "Worker", cell: (w) => h("span", { class: "mono" }, w.id) },
          { label: "Name", cell: (w) => w.name || "" },
          { label: "Kind", cell: (w) => w.kind },
          { label: "Availability", cell: (w) => w.availability },
          { label: "Capacity", cell: (w) => Object.entries(w.capacity || {}).map(([c, n]) => `${c}: ${n}`).join(", ") || "unlimited" },
          { label: "Skills", cell: (w) => Object.entries(w.skills || {}).map(([s, n]) => `${s} ${n}`).join(", ") },
          { label: "Weight", cell: (w) => String(w.weight), class: "num" },
        ],
        workers,
        { caption: "Workers", empty: "No workers yet." },
      ),
    ),
    section(
      "Rules",
      rules
        ? [h("form", { class: "inline-form", "aria-label": "Choose a rule set version", onSubmit: (e) => e.preventDefault() }, field("Version", versionSelect).row), ruleView]
        : h("p", { class: "empty" }, "No rule set is published yet."),
    ),
  );
  if (rules) await showRules();
}
