// One workflow family: its versions, a version's graph and definition (with any
// validation problems on their lines), two versions side by side, and a trigger.

import { api, idempotencyKey } from "../api.js";
import { dagLegend, dagSvg } from "../dag.js";
import { errorBox, field, fill, h, parseJson, section, select, table, timeEl } from "../dom.js";
import { jsonWithProblems, sideBySide } from "../jsonview.js";
import { runColumns } from "./runs.js";

export async function problemsList(problems) {
  if (!problems.length) return h("p", { class: "ok", role: "status" }, "✓ Valid: no problems.");
  return h(
    "div", { role: "alert" },
    h("p", { class: "error-text" }, `${problems.length} problem${problems.length > 1 ? "s" : ""}:`),
    h(
      "ul", { class: "problems" },
      problems.map((p) => h("li", {}, h("code", {}, p.pointer || "/"), " ", h("strong", {}, p.code || ""), " ", p.message)),
    ),
  );
}

export async function render(main, ctx) {
  const slug = ctx.params[0];
  ctx.title(`Workflow ${slug}`);
  const family = await api(`/v1/workflows/${encodeURIComponent(slug)}`);
  if (!ctx.current()) return;
  const versions = family.versions.map((v) => v.version).sort((a, b) => b - a);
  const latest = family.latest.version;
  const cache = new Map([[latest, family.latest]]);
  const getVersion = async (v) => {
    if (!cache.has(v)) cache.set(v, await api(`/v1/workflows/${encodeURIComponent(slug)}/versions/${v}`));
    return cache.get(v);
  };
  const options = versions.map((v) => [String(v), `version ${v}${v === latest ? " (latest)" : ""}`]);

  // --- a version ---------------------------------------------------------------
  const shown = select(options, String(latest), { name: "version" });
  const versionEl = h("div", { id: "version-view" });
  const showVersion = async () => {
    const v = await getVersion(Number(shown.value));
    let problems = [];
    try {
      problems = (await api("/v1/workflows/validate", { method: "POST", body: v.definition })).problems || [];
    } catch (err) {
      problems = [{ pointer: "", code: err.code, message: err.message }];
    }
    fill(
      versionEl,
      h("p", { class: "hint" }, `Hash ${v.hash}, published `, timeEl(v.created_at)),
      h("h3", {}, "Graph"),
      dagLegend(false),
      h("div", { class: "scroll-x graph" }, dagSvg(v.definition, null, { label: `Graph of ${slug} version ${v.version}` })),
      h("h3", {}, "Definition"),
      await problemsList(problems),
      jsonWithProblems(v.definition, problems, `Definition of ${slug} version ${v.version}`),
    );
  };
  shown.addEventListener("change", showVersion);

  // --- compare -------------------------------------------------------------------
  const left = select(options, String(versions[1] ?? latest), { name: "left" });
  const right = select(options, String(latest), { name: "right" });
  const diffEl = h("div", { id: "diff-view" });
  const compareForm = h(
    "form", { class: "inline-form", "aria-label": "Compare two versions" },
    field("From", left).row, field("To", right).row,
    h("button", { type: "submit" }, "Compare"),
  );
  compareForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    try {
      const [a, b] = await Promise.all([getVersion(Number(left.value)), getVersion(Number(right.value))]);
      fill(diffEl, sideBySide(a.definition, b.definition, `version ${a.version}`, `version ${b.version}`));
    } catch (err) {
      fill(diffEl, errorBox(err));
    }
  });

  // --- trigger -------------------------------------------------------------------
  let triggerKey = idempotencyKey();
  const triggerVersion = select([["", "latest"], ...options], "", { name: "trigger-version" });
  const input = h("textarea", { name: "input", rows: "4", spellcheck: "false" }, "{}");
  const triggerResult = h("div", {});
  const triggerButton = h("button", { type: "submit" }, "Trigger run");
  const triggerForm = h(
    "form", { class: "stack-form", "aria-label": "Trigger a run" },
    field("Version", triggerVersion).row,
    field("Input (JSON)", input, "The run's input; {} when empty.").row,
    triggerButton,
    triggerResult,
  );
  triggerForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    triggerButton.disabled = true;
    try {
      const value = parseJson(input.value, "The input");
      const body = { family_slug: slug, input: value === undefined ? {} : value };
      if (triggerVersion.value) body.version = Number(triggerVersion.value);
      const started = await api("/v1/runs", { method: "POST", body, idempotency: triggerKey });
      triggerKey = idempotencyKey();
      ctx.navigate(`#/runs/${encodeURIComponent(started.id)}`);
    } catch (err) {
      fill(triggerResult, errorBox(err));
      triggerButton.disabled = false;
    }
  });

  const runsEl = h("div", {});
  fill(
    main,
    h("div", { class: "title-row" }, h("h1", {}, "Workflow ", h("span", { class: "mono" }, slug)), h("span", { class: "hint" }, family.latest.definition.title || "")),
    h(
      "div", { class: "two-col" },
      section("Trigger", triggerForm),
      section(
        "Versions",
        table(
          [
            { label: "Version", cell: (v) => String(v.version), class: "num" },
            { label: "Hash", cell: (v) => h("span", { class: "mono hash" }, v.hash.slice(0, 19)) },
            { label: "Published", cell: (v) => timeEl(v.created_at) },
          ],
          [...family.versions].sort((a, b) => b.version - a.version),
          { caption: "Published versions, newest first" },
        ),
      ),
    ),
    section("Compare versions", compareForm, diffEl),
    section("A version's graph and definition", h("form", { class: "inline-form", "aria-label": "Choose a version", onSubmit: (e) => e.preventDefault() }, field("Show", shown).row), versionEl),
    section("Recent runs", runsEl),
  );
  await showVersion();
  const recent = await api("/v1/runs", { query: { family_slug: slug, limit: 10 } });
  if (ctx.current()) fill(runsEl, table(runColumns(), recent.items, { caption: `Latest runs of ${slug}`, empty: "No runs yet." }));
}
