// A routing decision and its explanation, stage by stage: the rule that matched
// and why the others did not, the candidates, who was excluded and why, the
// strategy's scores and pick, and what each shadow strategy would have picked.

import { api } from "../api.js";
import { fill, fmtMicros, h, jsonBlock, table } from "../dom.js";

function outcomeBadge(outcome) {
  const word = { assigned: "succeeded", unassigned: "waiting", invalid: "failed" }[outcome] || "pending";
  return h("span", { class: `badge status-${word}` }, outcome);
}

function stage(number, title, ...children) {
  const id = `stage-${number}`;
  return h("li", { class: "stage", "aria-labelledby": id }, h("h3", { id }, h("span", { class: "stage-no" }, `${number}`), title), children);
}

function scoreText(value) {
  if (value === null || value === undefined) return "cannot be picked";
  return typeof value === "number" ? String(Math.round(value * 1000) / 1000) : String(value);
}

export function explanationView(decision) {
  const ex = decision.explanation || {};
  const notMatched = ex.rules_not_matched || [];
  const ruleRows = [
    ...notMatched.map((r) => ({ ...r, matched: false })),
    ...(ex.rule ? [{ rule: ex.rule, matched: true, reason: ex.rule === "default" ? "default pool" : "matched", detail: "" }] : []),
  ];
  const enriched = ex.enriched && Object.keys(ex.enriched).length ? ex.enriched : null;
  return h(
    "div", { class: "explanation" },
    h(
      "dl", { class: "meta" },
      h("dt", {}, "Outcome"), h("dd", {}, outcomeBadge(decision.outcome)),
      h("dt", {}, "Routable"), h("dd", {}, h("span", { class: "mono" }, decision.routable_id), ` (kind ${decision.kind})`),
      h("dt", {}, "Decided at"), h("dd", {}, decision.at),
      h("dt", {}, "Rule set"), h("dd", {}, `${ex.rule_set} version ${ex.rule_set_version}`, ex.config_hash ? h("span", { class: "mono hash" }, ` ${ex.config_hash.slice(0, 23)}`) : ""),
      h("dt", {}, "Pick"), h("dd", {}, decision.worker ? h("strong", { class: "pick" }, decision.worker) : "nobody", decision.pool ? ` in pool ${decision.pool}` : ""),
      decision.charge ? [h("dt", {}, "Charge"), h("dd", {}, fmtMicros(decision.charge))] : null,
      decision.assignment_id ? [h("dt", {}, "Assignment"), h("dd", { class: "mono" }, decision.assignment_id)] : null,
    ),
    h(
      "ol", { class: "stages" },
      stage(
        1, "Rules",
        ex.rule ? h("p", {}, "Matched rule: ", h("strong", { class: "pick" }, ex.rule)) : h("p", { class: "error-text" }, "No rule matched and there is no default pool."),
        table(
          [
            { label: "Rule", cell: (r) => h("span", { class: "mono" }, r.rule) },
            { label: "Priority", cell: (r) => (r.priority === undefined ? "" : String(r.priority)), class: "num" },
            { label: "Result", cell: (r) => (r.matched ? h("span", { class: "yes" }, "✓ matched") : h("span", { class: "no" }, "✗ did not match")) },
            { label: "Why", cell: (r) => ({ match: "a match filter failed", when: "its condition was false", error: "its condition did not evaluate" }[r.reason] || r.reason) },
            { label: "Detail", cell: (r) => (r.detail ? h("code", {}, r.detail) : "") },
          ],
          ruleRows,
          { caption: "Rules tried, in priority order", empty: "No rule was tried." },
        ),
      ),
      stage(2, "Enrich", enriched ? jsonBlock(enriched, "Attributes added by enrichers") : h("p", { class: "empty" }, "No attributes were added.")),
      stage(
        3, `Candidates${ex.pool ? ` in pool ${ex.pool}` : ""}`,
        h("p", {}, (ex.candidates || []).length ? ["Eligible: ", (ex.candidates || []).map((c, i) => [i ? ", " : "", h("span", { class: "mono" }, c)])] : "No eligible candidate."),
        table(
          [
            { label: "Reason", cell: (e) => e.reason },
            { label: "Detail", cell: (e) => e.detail || "" },
            { label: "Workers excluded", cell: (e) => e.workers.join(", ") },
          ],
          ex.excluded || [],
          { caption: "Members excluded, by reason", empty: "Nobody was excluded." },
        ),
      ),
      stage(
        4, `Select${ex.strategy ? ` (${ex.strategy})` : ""}`,
        table(
          [
            { label: "Worker", cell: (s) => h("span", { class: s.worker === ex.pick ? "mono pick" : "mono" }, s.worker, s.worker === ex.pick ? " ← pick" : "") },
            { label: "Score", cell: (s) => scoreText(s.value), class: "num" },
            { label: "Note", cell: (s) => s.note || "" },
          ],
          ex.scores || [],
          { caption: "The live strategy's scores", empty: "The strategy scored nobody." },
        ),
        h("p", {}, "Pick: ", ex.pick ? h("strong", { class: "pick" }, ex.pick) : "none", ex.note ? ` (${ex.note})` : ""),
      ),
      stage(
        5, "Shadows",
        table(
          [
            { label: "Shadow strategy", cell: (s) => s.strategy },
            { label: "Would pick", cell: (s) => s.pick || "nobody" },
            { label: "Agrees with live", cell: (s) => (s.agrees ? h("span", { class: "yes" }, "✓ agrees") : h("span", { class: "no" }, "✗ differs")) },
            { label: "Price", cell: (s) => (s.price === null || s.price === undefined ? "" : fmtMicros(s.price)), class: "num" },
            { label: "Note", cell: (s) => s.note || "" },
          ],
          ex.shadows || [],
          { caption: "What each shadow strategy would have picked (never committed)", empty: "The pool has no shadow strategies." },
        ),
      ),
    ),
    h("details", {}, h("summary", {}, "The decision as JSON"), jsonBlock(decision, "Decision JSON")),
  );
}

export async function render(main, ctx) {
  const id = ctx.params[0];
  ctx.title(`Decision ${id}`);
  const decision = await api(`/v1/decisions/${encodeURIComponent(id)}`);
  if (!ctx.current()) return;
  fill(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Decision ", h("span", { class: "mono" }, id)), h("a", { href: "#/routing", class: "button secondary" }, "Back to routing")),
    explanationView(decision),
  );
}
