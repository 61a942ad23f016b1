// JSON shown line by line, each line knowing the JSON pointer of the value it
// starts, so validation problems (which carry pointers) are shown on the line
// they are about; and a side-by-side line diff of two such texts.

import { h } from "./dom.js";

function escapePointer(token) {
  return String(token).replace(/~/g, "~0").replace(/\//g, "~1");
}

/** Pretty-print `value` (2 spaces) into [{text, pointer}], one per line. */
export function jsonLines(value) {
  const lines = [];
  const walk = (v, pointer, indent, prefix, suffix) => {
    const pad = "  ".repeat(indent);
    if (Array.isArray(v) && v.length) {
      lines.push({ text: `${pad}${prefix}[`, pointer });
      v.forEach((item, i) => walk(item, `${pointer}/${i}`, indent + 1, "", i < v.length - 1 ? "," : ""));
      lines.push({ text: `${pad}]${suffix}`, pointer });
    } else if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length) {
      lines.push({ text: `${pad}${prefix}{`, pointer });
      const keys = Object.keys(v);
      keys.forEach((k, i) =>
        walk(v[k], `${pointer}/${escapePointer(k)}`, indent + 1, `${JSON.stringify(k)}: `, i < keys.length - 1 ? "," : ""),
      );
      lines.push({ text: `${pad}}${suffix}`, pointer });
    } else {
      lines.push({ text: `${pad}${prefix}${JSON.stringify(v === undefined ? null : v)}${suffix}`, pointer });
    }
  };
  walk(value, "", 0, "", "");
  return lines;
}

/** The line a pointer is best shown on: its own, else its nearest ancestor's. */
function lineFor(lines, pointer) {
  let p = pointer || "";
  for (;;) {
    const i = lines.findIndex((l) => l.pointer === p);
    if (i >= 0) return i;
    if (!p) return 0;
    p = p.slice(0, p.lastIndexOf("/"));
  }
}

/**
 * The JSON with line numbers; `problems` ([{pointer, message, code}]) are marked
 * on their lines and listed under them.
 */
export function jsonWithProblems(value, problems = [], label = "Definition") {
  const lines = jsonLines(value);
  const byLine = new Map();
  for (const problem of problems) {
    const i = lineFor(lines, problem.pointer);
    if (!byLine.has(i)) byLine.set(i, []);
    byLine.get(i).push(problem);
  }
  return h(
    "div", { class: "code", role: "region", "aria-label": label, tabindex: "0" },
    h(
      "ol", { class: "lines" },
      lines.map((line, i) =>
        h(
          "li", { class: byLine.has(i) ? "line has-problem" : "line", "data-pointer": line.pointer },
          h("span", { class: "text" }, line.text),
          byLine.has(i)
            ? byLine.get(i).map((p) =>
                h("span", { class: "problem-note", role: "note" }, `⚠ ${p.code ? `${p.code}: ` : ""}${p.message}`),
              )
            : null,
        ),
      ),
    ),
  );
}

/** Line diff by longest common subsequence: [{op: "same"|"del"|"add", a?, b?}]. */
export function diffLines(a, b) {
  const n = a.length;
  const m = b.length;
  if (n * m > 4_000_000) return null;
  const dp = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
  for (let i = n - 1; i >= 0; i -= 1) {
    for (let j = m - 1; j >= 0; j -= 1) {
      dp[i][j] = a[i] === b[j] ? dp[i + 1][j + 1] + 1 : Math.max(dp[i + 1][j], dp[i][j + 1]);
    }
  }
  const ops = [];
  let i = 0;
  let j = 0;
  while (i < n && j < m) {
    if (a[i] === b[j]) {
      ops.push({ op: "same", a: i, b: j });
      i += 1;
      j += 1;
    } else if (dp[i + 1][j] >= dp[i][j + 1]) {
      ops.push({ op: "del", a: i });
      i += 1;
    } else {
      ops.push({ op: "add", b: j });
      j += 1;
    }
  }
  while (i < n) ops.push({ op: "del", a: i++ });
  while (j < m) ops.push({ op: "add", b: j++ });
  return ops;
}

/** Two JSON values side by side, removed lines on the left, added on the right. */
export function sideBySide(left, right, leftLabel, rightLabel) {
  const a = jsonLines(left).map((l) => l.text);
  const b = jsonLines(right).map((l) => l.text);
  const ops = diffLines(a, b);
  if (ops === null) return h("p", { class: "error", role: "alert" }, "These versions are too large to compare here.");
  // Pair each run of deletions with the run of additions after it.
  const rows = [];
  for (let k = 0; k < ops.length; ) {
    if (ops[k].op === "same") {
      rows.push([ops[k].a, ops[k].b, "same"]);
      k += 1;
      continue;
    }
    const dels = [];
    const adds = [];
    while (k < ops.length && ops[k].op === "del") dels.push(ops[k++].a);
    while (k < ops.length && ops[k].op === "add") adds.push(ops[k++].b);
    for (let t = 0; t < Math.max(dels.length, adds.length); t += 1) {
      rows.push([dels[t] ?? null, adds[t] ?? null, "change"]);
    }
  }
  const changed = rows.filter((r) => r[2] === "change").length;
  // Unchanged lines further than CONTEXT from a change fold into one row.
  const CONTEXT = 3;
  const near = rows.map(() => false);
  rows.forEach((r, i) => {
    if (r[2] !== "change") return;
    for (let k = Math.max(0, i - CONTEXT); k <= Math.min(rows.length - 1, i + CONTEXT); k += 1) near[k] = true;
  });
  const shown = [];
  for (let i = 0; i < rows.length; ) {
    if (near[i] || rows[i][2] === "change") {
      shown.push(rows[i]);
      i += 1;
      continue;
    }
    let j = i;
    while (j < rows.length && !near[j] && rows[j][2] !== "change") j += 1;
    shown.push([null, null, "fold", j - i]);
    i = j;
  }
  const cell = (idx, lines, side) =>
    idx === null
      ? [h("td", { class: "ln" }), h("td", { class: "blank" })]
      : [h("td", { class: "ln" }, String(idx + 1)), h("td", { class: side }, lines[idx])];
  return h(
    "div", { class: "table-wrap diff-wrap" },
    h(
      "table", { class: "diff" },
      h("caption", {}, changed ? `${changed} changed line${changed > 1 ? "s" : ""} between ${leftLabel} and ${rightLabel}` : `${leftLabel} and ${rightLabel} are the same`),
      h(
        "thead", {},
        h("tr", {}, h("th", { scope: "col", class: "ln" }, "#"), h("th", { scope: "col" }, leftLabel), h("th", { scope: "col", class: "ln" }, "#"), h("th", { scope: "col" }, rightLabel)),
      ),
      h(
        "tbody", {},
        shown.map(([ia, ib, kind, folded]) =>
          kind === "fold" ? h("tr", { class: "fold" }, h("td", { colspan: "4" }, `⋯ ${folded} unchanged line${folded > 1 ? "s" : ""}`)) : h(
            "tr", { class: kind },
            cell(ia, a, kind === "change" ? "del" : "same"),
            cell(ib, b, kind === "change" ? "add" : "same"),
          ),
        ),
      ),
    ),
  );
}
