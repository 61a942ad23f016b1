// Drawing a workflow's DAG as SVG: a layered layout (left to right), steps
// coloured by status, and edges drawn as taken, not taken or not yet decided.
//
// Which edges were taken is worked out from the run's step states with the
// engine's rules (docs: DESIGN "Definitions"): SUCCESS is taken when the source
// succeeded, FAILURE when it failed, ALWAYS when either; a skipped or cancelled
// source takes none. A CONDITION edge's verdict is not in the API's run view:
// it is "not taken" when its target was skipped or the source did not succeed,
// "taken" when its target ran and no other edge can explain that, and
// "decided" (drawn apart) otherwise: a target still pending, or cancelled
// before it started (a failed run cancels the steps it had not started).

import { h, statusWord } from "./dom.js";

const NODE_W = 176;
const NODE_H = 54;
const GAP_X = 116;
const GAP_Y = 22;
const PAD = 16;

const ENDED = new Set(["succeeded", "failed", "skipped", "cancelled"]);

/** Layers by longest path from a source; order within a layer by the parents' mean. */
export function layout(steps, edges) {
  const refs = steps.map((s) => s.ref);
  const index = new Map(refs.map((r, i) => [r, i]));
  const incoming = new Map(refs.map((r) => [r, []]));
  const outgoing = new Map(refs.map((r) => [r, []]));
  for (const e of edges) {
    if (!index.has(e.source_ref) || !index.has(e.target_ref)) continue;
    outgoing.get(e.source_ref).push(e.target_ref);
    incoming.get(e.target_ref).push(e.source_ref);
  }
  // Kahn's order; whatever a cycle leaves over goes after, in document order.
  const indegree = new Map(refs.map((r) => [r, incoming.get(r).length]));
  const order = [];
  const queue = refs.filter((r) => indegree.get(r) === 0);
  while (queue.length) {
    const r = queue.shift();
    order.push(r);
    for (const t of outgoing.get(r)) {
      indegree.set(t, indegree.get(t) - 1);
      if (indegree.get(t) === 0) queue.push(t);
    }
  }
  const placed = new Set(order);
  for (const r of refs) if (!placed.has(r)) order.push(r);
  const layerOf = new Map();
  for (const r of order) {
    let layer = 0;
    for (const p of incoming.get(r)) if (layerOf.has(p)) layer = Math.max(layer, layerOf.get(p) + 1);
    layerOf.set(r, layer);
  }
  const layers = [];
  for (const r of refs) {
    const l = layerOf.get(r);
    (layers[l] ||= []).push(r);
  }
  const row = new Map();
  layers.forEach((layer, li) => {
    if (li > 0) {
      const mean = (r) => {
        const ps = incoming.get(r).filter((p) => row.has(p));
        return ps.length ? ps.reduce((a, p) => a + row.get(p), 0) / ps.length : index.get(r);
      };
      layer.sort((a, b) => mean(a) - mean(b) || index.get(a) - index.get(b));
    }
    layer.forEach((r, i) => row.set(r, i));
  });
  const tallest = Math.max(1, ...layers.map((l) => (l ? l.length : 0)));
  const height = PAD * 2 + tallest * NODE_H + (tallest - 1) * GAP_Y;
  const pos = new Map();
  layers.forEach((layer, li) => {
    const span = layer.length * NODE_H + (layer.length - 1) * GAP_Y;
    const top = (height - span) / 2;
    layer.forEach((r, i) => pos.set(r, { x: PAD + li * (NODE_W + GAP_X), y: top + i * (NODE_H + GAP_Y) }));
  });
  const width = PAD * 2 + layers.length * NODE_W + Math.max(0, layers.length - 1) * GAP_X;
  return { pos, width, height };
}

function plainTaken(type, source) {
  if (source === "succeeded") return type === "EDGE_TYPE_SUCCESS" || type === "EDGE_TYPE_ALWAYS";
  if (source === "failed") return type === "EDGE_TYPE_FAILURE" || type === "EDGE_TYPE_ALWAYS";
  return false;
}

/** Each edge's state for a run: "taken", "not-taken", "decided" or "pending" ("plan" without a run). */
export function edgeStates(edges, stepsByRef) {
  if (!stepsByRef) return edges.map(() => "plan");
  const word = (ref) => statusWord(stepsByRef.get(ref)?.status);
  const first = edges.map((e) => {
    const source = word(e.source_ref);
    const target = word(e.target_ref);
    const type = e.type || "EDGE_TYPE_SUCCESS";
    if (!ENDED.has(source)) return "pending";
    if (type !== "EDGE_TYPE_CONDITION") return plainTaken(type, source) ? "taken" : "not-taken";
    if (source !== "succeeded" || target === "skipped") return "not-taken";
    if (target === "pending" || (target === "cancelled" && !stepsByRef.get(e.target_ref)?.started_at)) return "decided";
    return "maybe";
  });
  // A condition edge into a step that ran is taken when no other edge into it was.
  return first.map((state, i) => {
    if (state !== "maybe") return state;
    const target = edges[i].target_ref;
    const others = first.filter((s, j) => j !== i && edges[j].target_ref === target && (s === "taken" || s === "maybe"));
    return others.length ? "decided" : "taken";
  });
}

const EDGE_LABEL = {
  EDGE_TYPE_FAILURE: "on failure",
  EDGE_TYPE_ALWAYS: "always",
  EDGE_TYPE_CONDITION: "if",
};

function shortType(type) {
  return String(type || "").replace(/^STEP_TYPE_/, "").toLowerCase().replace(/_/g, " ");
}

function clip(text, n) {
  return text.length > n ? `${text.slice(0, n - 1)}…` : text;
}

/**
 * The DAG of `definition` as an <svg>; with `run`, steps take its statuses and
 * edges show which were taken. `onStep(ref)` makes steps clickable.
 */
export function dagSvg(definition, run, { onStep, label } = {}) {
  const steps = definition.steps || [];
  const edges = (definition.edges || []).filter((e) => e && e.source_ref && e.target_ref);
  const { pos, width, height } = layout(steps, edges);
  const byRef = run ? new Map(run.steps.map((s) => [s.ref, s])) : null;
  const states = edgeStates(edges, byRef);
  const svg = h(
    "svg:svg", {
      class: "dag", width, height, viewBox: `0 0 ${width} ${height}`, role: "group",
      "aria-label": label || `Workflow graph: ${steps.length} steps, ${edges.length} edges`,
    },
    h(
      "svg:defs", {},
      ["taken", "not-taken", "pending", "decided", "plan"].map((s) =>
        h(
          "svg:marker", {
            id: `arrow-${s}`, viewBox: "0 0 10 10", refX: "9", refY: "5", markerWidth: "7", markerHeight: "7", orient: "auto-start-reverse",
          },
          h("svg:path", { d: "M 0 0 L 10 5 L 0 10 z", class: `arrowhead edge-${s}` }),
        ),
      ),
    ),
  );
  edges.forEach((e, i) => {
    const a = pos.get(e.source_ref);
    const b = pos.get(e.target_ref);
    if (!a || !b) return;
    const x1 = a.x + NODE_W;
    const y1 = a.y + NODE_H / 2;
    const x2 = b.x - 2;
    const y2 = b.y + NODE_H / 2;
    const back = x2 <= x1;
    const dx = back ? 60 : Math.max(24, (x2 - x1) / 2);
    const d = `M ${x1} ${y1} C ${x1 + dx} ${y1}, ${x2 - dx} ${y2}, ${x2} ${y2}`;
    const state = states[i];
    const type = e.type || "EDGE_TYPE_SUCCESS";
    const words = { taken: "taken", "not-taken": "not taken", pending: "not decided yet", decided: "decided", plan: "" }[state];
    const g = h(
      "svg:g", { class: `edge edge-${state}`, "data-edge": `${e.source_ref}->${e.target_ref}`, "data-state": state },
      h("svg:title", {}, `${e.source_ref} → ${e.target_ref} (${shortType(type.replace("EDGE_TYPE_", ""))}${e.condition ? `: ${e.condition}` : ""})${words ? `, ${words}` : ""}`),
      h("svg:path", { d, "marker-end": `url(#arrow-${state})` }),
    );
    const tag = EDGE_LABEL[type];
    if (tag) {
      const text = type === "EDGE_TYPE_CONDITION" && e.condition ? `if ${clip(e.condition, 20)}` : tag;
      g.append(h("svg:text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 5, class: "edge-label", "text-anchor": "middle" }, text));
    }
    svg.append(g);
  });
  for (const step of steps) {
    const p = pos.get(step.ref);
    const state = byRef ? byRef.get(step.ref) : null;
    const word = state ? statusWord(state.status) : "plan";
    const title = step.title || step.ref;
    const node = h(
      "svg:g", {
        class: `node status-${word}`, transform: `translate(${p.x} ${p.y})`, "data-step": step.ref, "data-status": word,
        tabindex: onStep ? "0" : null, role: onStep ? "button" : "img",
        "aria-label": `${title} (${step.ref}), ${shortType(step.type)}${state ? `, ${word}` : ""}`,
      },
      h("svg:title", {}, `${step.ref}: ${shortType(step.type)}${state ? ` · ${word}${state.attempt ? ` · attempt ${state.attempt}` : ""}` : ""}`),
      h("svg:rect", { width: NODE_W, height: NODE_H, rx: 8, ry: 8 }),
      h("svg:text", { x: 10, y: 21, class: "node-title" }, clip(title, 22)),
      h("svg:text", { x: 10, y: 40, class: "node-sub" }, clip(`${shortType(step.type)}${state ? ` · ${word}` : ""}`, 26)),
    );
    if (onStep) {
      node.addEventListener("click", () => onStep(step.ref));
      node.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          onStep(step.ref);
        }
      });
    }
    svg.append(node);
  }
  return svg;
}

export function dagLegend(withRun) {
  const items = withRun
    ? [
        ["edge-taken", "edge taken"], ["edge-not-taken", "edge not taken"], ["edge-pending", "not decided yet"],
        ["edge-decided", "condition decided (verdict not reported)"],
      ]
    : [["edge-plan", "edge"]];
  return h(
    "ul", { class: "legend", "aria-label": "Legend" },
    items.map(([cls, text]) =>
      h("li", {}, h("svg:svg", { width: 28, height: 10, "aria-hidden": "true", class: `edge ${cls}` }, h("svg:path", { d: "M 2 5 L 26 5" })), text),
    ),
  );
}
