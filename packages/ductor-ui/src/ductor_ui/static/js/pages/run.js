// One run: its DAG, steps, timeline, input and output, history, and the buttons
// that cancel it, signal it and start it again. Live until the run ends.

import { api, idempotencyKey } from "../api.js";
import { dagLegend, dagSvg } from "../dag.js";
import {
  announce, badge, errorBox, field, fill, fmtDuration, fmtTime, h, isTerminal, jsonBlock, link,
  parseJson, pretty, section, statusWord, table, timeEl,
} from "../dom.js";
import { keepFocus } from "../focus.js";

function describe(entry) {
  const d = entry.data || {};
  const kind = entry.kind;
  const step = d.step_ref ? `${d.step_ref}${d.item_index !== undefined ? `[${d.item_index}]` : ""}` : "";
  let what = kind;
  let detail = "";
  if (kind.startsWith("step.") || kind.startsWith("item.")) {
    const word = kind.split(".")[1];
    what = {
      running: `attempt ${d.attempt} started`,
      retrying: `attempt ${d.attempt} failed, retrying`,
      waiting: "waiting",
      succeeded: `succeeded (attempt ${d.attempt})`,
      failed: `failed (attempt ${d.attempt})`,
      skipped: "skipped",
      cancelled: "cancelled",
    }[word] || word;
    if (d.error) detail = `${d.error.code}: ${d.error.message}`;
    if (d.retry_at) detail += `${detail ? "; " : ""}next attempt at ${fmtTime(d.retry_at)}`;
    if (d.waiting_for) detail = `for ${d.waiting_for}`;
    if (d.child_run_id) detail += `${detail ? "; " : ""}child run ${d.child_run_id}`;
  } else if (kind === "signal.received") {
    what = `signal "${d.name}" received`;
  } else if (kind === "event.received") {
    what = `event "${d.name}" received`;
  } else if (kind === "run.cancel_requested") {
    what = "cancel requested";
    detail = d.reason || "";
  } else if (kind === "child.ended") {
    what = `child run ended (${statusWord(d.status)})`;
    detail = d.child_run_id;
  } else if (kind.startsWith("run.")) {
    what = `run ${kind.slice(4)}`;
    if (d.error) detail = `${d.error.code}: ${d.error.message}`;
  } else if (kind === "input.ignored") {
    what = "input ignored";
    detail = `${d.input}: ${d.reason}`;
  }
  return { step, what, detail };
}

function timeline(run) {
  const started = new Date(run.created_at).getTime();
  const end = run.finished_at ? new Date(run.finished_at).getTime() : Date.now();
  const span = Math.max(1, end - started);
  const rows = run.steps.filter((s) => s.started_at);
  if (!rows.length) return h("p", { class: "empty" }, "No step has started yet.");
  const labelW = 150;
  const barW = 560;
  const rowH = 24;
  const svg = h(
    "svg:svg", {
      class: "gantt", width: labelW + barW + 90, height: rows.length * rowH + 24, role: "img",
      "aria-label": `Timeline of ${rows.length} steps over ${fmtDuration(span)}`,
    },
  );
  rows.forEach((s, i) => {
    const a = new Date(s.started_at).getTime();
    const b = s.finished_at ? new Date(s.finished_at).getTime() : end;
    const x = labelW + ((a - started) / span) * barW;
    const w = Math.max(3, ((b - a) / span) * barW);
    const y = i * rowH + 4;
    const word = statusWord(s.status);
    svg.append(
      h("svg:text", { x: 0, y: y + 14, class: "gantt-label" }, s.ref.length > 20 ? `${s.ref.slice(0, 19)}…` : s.ref),
      h(
        "svg:rect", { x, y, width: w, height: rowH - 8, rx: 3, class: `bar status-${word}` },
        h("svg:title", {}, `${s.ref}: ${word}, ${fmtDuration(b - a)}${s.attempt > 1 ? `, ${s.attempt} attempts` : ""}`),
      ),
      h("svg:text", { x: Math.min(x + w + 4, labelW + barW + 4), y: y + 14, class: "gantt-value" }, fmtDuration(b - a)),
    );
  });
  svg.append(
    h("svg:text", { x: labelW, y: rows.length * rowH + 20, class: "gantt-axis" }, "0 s"),
    h("svg:text", { x: labelW + barW, y: rows.length * rowH + 20, class: "gantt-axis", "text-anchor": "end" }, fmtDuration(span)),
  );
  return h("div", { class: "scroll-x" }, svg);
}

function stepsTable(run) {
  return table(
    [
      { label: "Step", cell: (s) => h("span", { id: `step-${s.ref}`, tabindex: "-1", class: "mono" }, s.ref) },
      { label: "Type", cell: (s) => s.type.replace(/^STEP_TYPE_/, "") },
      { label: "Status", cell: (s) => badge(s.status) },
      { label: "Attempt", cell: (s) => (s.attempt ? String(s.attempt) : ""), class: "num" },
      { label: "Started", cell: (s) => timeEl(s.started_at) },
      { label: "Took", cell: (s) => (s.started_at && s.finished_at ? fmtDuration(new Date(s.finished_at) - new Date(s.started_at)) : ""), class: "num" },
      {
        label: "Detail",
        cell: (s) => [
          s.waiting_for ? `waiting for ${s.waiting_for}` : "",
          s.retry_at ? ` next attempt ${fmtTime(s.retry_at)}` : "",
          s.error ? h("span", { class: "err" }, `${s.error.code}: ${s.error.message}`) : "",
          s.child_run_id ? [" child ", link(`#/runs/${encodeURIComponent(s.child_run_id)}`, s.child_run_id)] : "",
          s.items ? ` ${s.items.length} items` : "",
        ],
      },
    ],
    run.steps,
    { caption: "Steps in definition order", rowKey: (s) => s.ref },
  );
}

export async function render(main, ctx) {
  const runId = ctx.params[0];
  ctx.title(`Run ${runId}`);
  let run = await api(`/v1/runs/${encodeURIComponent(runId)}`);
  if (!ctx.current()) return;
  let definition = null;
  try {
    const version = await api(`/v1/workflows/${encodeURIComponent(run.family_slug)}/versions/${run.version}`);
    definition = version.definition;
  } catch {
    // Another run kind (a bridge app's workflow) has no stored definition: draw its steps.
    definition = { steps: run.steps.map((s) => ({ ref: s.ref, type: s.type, title: s.title })), edges: [] };
  }

  const statusEl = h("span", { id: "run-status" });
  const headerMeta = h("dl", { class: "meta" });
  const actionsEl = h("div", { class: "actions" });
  const actionResult = h("div", { id: "action-result" });
  const graphEl = h("div", { class: "scroll-x graph", id: "run-graph" });
  const stepsEl = h("div", { id: "run-steps" });
  const timelineEl = h("div", { id: "run-timeline" });
  const eventsEl = h("div", { id: "run-events" });
  const ioEl = h("div", { class: "io" });
  const historyEl = h("div", { id: "run-history" });

  const focusStep = (ref) => {
    const el = document.getElementById(`step-${ref}`);
    if (el) {
      el.scrollIntoView({ block: "center" });
      el.focus();
    }
  };

  // --- actions ---------------------------------------------------------------
  let cancelKey = idempotencyKey();
  const reason = h("input", { type: "text", name: "reason", placeholder: "optional" });
  const cancelButton = h("button", { type: "submit", class: "danger" }, "Cancel run");
  const cancelForm = h(
    "form", { class: "inline-form", "aria-label": "Cancel the run" },
    field("Reason", reason).row,
    cancelButton,
  );
  cancelForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    cancelButton.disabled = true;
    try {
      await api(`/v1/runs/${encodeURIComponent(runId)}/cancel`, {
        method: "POST", body: reason.value ? { reason: reason.value } : {}, idempotency: cancelKey,
      });
      cancelKey = idempotencyKey();
      fill(actionResult, h("p", { class: "notice", role: "status" }, "Cancel requested: the run stops at its next tick."));
      await refresh();
    } catch (err) {
      fill(actionResult, errorBox(err));
      cancelButton.disabled = false;
    }
  });

  let signalKey = idempotencyKey();
  const signalName = h("input", { type: "text", name: "signal", required: true, autocomplete: "off" });
  const signalPayload = h("textarea", { name: "payload", rows: "2", placeholder: '{"approved": true}' });
  const signalButton = h("button", { type: "submit" }, "Send signal");
  const signalForm = h(
    "form", { class: "inline-form", "aria-label": "Send a signal to the run" },
    field("Signal name", signalName).row,
    field("Payload (JSON, optional)", signalPayload).row,
    signalButton,
  );
  signalForm.addEventListener("submit", async (event) => {
    event.preventDefault();
    signalButton.disabled = true;
    try {
      const payload = parseJson(signalPayload.value, "The payload");
      const answer = await api(`/v1/runs/${encodeURIComponent(runId)}/signals/${encodeURIComponent(signalName.value)}`, {
        method: "POST", body: payload === undefined ? {} : { payload }, idempotency: signalKey,
      });
      signalKey = idempotencyKey();
      fill(actionResult, h("p", { class: "notice", role: "status" }, `Signal "${answer.name}" sent (${answer.signal_id})${answer.duplicate ? ", already seen" : ""}.`));
      await refresh();
    } catch (err) {
      fill(actionResult, errorBox(err));
    } finally {
      signalButton.disabled = isTerminal(run.status);
    }
  });

  const rerunButton = h("button", { type: "button", class: "secondary" }, "Run again with the same input");
  let rerunKey = idempotencyKey();
  rerunButton.addEventListener("click", async () => {
    rerunButton.disabled = true;
    try {
      // POST /v1/runs/{id}/rerun: a new run of the same version with the same input.
      const started = await api(`/v1/runs/${encodeURIComponent(run.id)}/rerun`, {
        method: "POST", body: {}, idempotency: rerunKey,
      });
      rerunKey = idempotencyKey();
      ctx.navigate(`#/runs/${encodeURIComponent(started.run.id)}`);
    } catch (err) {
      fill(actionResult, errorBox(err));
      rerunButton.disabled = false;
    }
  });

  fill(
    main,
    h(
      "div", { class: "title-row" },
      h("h1", {}, "Run ", h("span", { class: "mono" }, runId)),
      statusEl,
    ),
    headerMeta,
    h(
      "section", { class: "panel", "aria-labelledby": "run-actions-title" },
      h("h2", { id: "run-actions-title" }, "Actions"),
      actionsEl,
      h("p", { class: "hint" }, "Re-running an ended run starts a new run of the same workflow version with the same input."),
      actionResult,
    ),
    section("Graph", dagLegend(true), graphEl),
    section("Steps", stepsEl),
    section("Timeline", timelineEl, h("h3", {}, "Attempts, waits and retries"), eventsEl),
    section("Input and output", ioEl),
    section("History", historyEl),
  );
  fill(actionsEl, cancelForm, signalForm, rerunButton);

  let lastStatus = run.status;
  let history = [];
  // What each part was last drawn from: a part whose data has not changed is left as
  // it is, so a poll neither undoes a reader's text selection nor rebuilds a long
  // history every second.
  const drawnFrom = new Map();
  const redraw = (el, data, paint) => {
    const key = JSON.stringify(data);
    if (drawnFrom.get(el) === key) return;
    drawnFrom.set(el, key);
    keepFocus(el, paint);
  };

  function draw() {
    fill(statusEl, badge(run.status), run.cancel_requested && !isTerminal(run.status) ? h("span", { class: "hint" }, " cancel requested") : "");
    redraw(headerMeta, [run.family_slug, run.version, run.created_at, run.finished_at, run.parent_run_id], () => fill(
      headerMeta,
      h("dt", {}, "Workflow"), h("dd", {}, link(`#/workflows/${encodeURIComponent(run.family_slug)}`, run.family_slug), ` version ${run.version}`),
      h("dt", {}, "Started"), h("dd", {}, timeEl(run.created_at)),
      h("dt", {}, "Ended"), h("dd", {}, run.finished_at ? [timeEl(run.finished_at), ` (${fmtDuration(new Date(run.finished_at) - new Date(run.created_at))})`] : "not yet"),
      run.parent_run_id ? [h("dt", {}, "Parent run"), h("dd", {}, link(`#/runs/${encodeURIComponent(run.parent_run_id)}`, run.parent_run_id))] : null,
    ));
    const ended = isTerminal(run.status);
    cancelButton.disabled = ended || run.cancel_requested;
    signalButton.disabled = ended;
    // The API re-runs ended runs only (409 run.not_ended otherwise).
    rerunButton.hidden = !ended;
    // An ended run takes no cancel or signal: only "run again" is offered.
    cancelForm.hidden = ended;
    signalForm.hidden = ended;
    const waiting = run.steps.find((s) => s.waiting_for && s.waiting_for.startsWith("signal "));
    if (waiting && !signalName.value && document.activeElement !== signalName) signalName.value = waiting.waiting_for.slice(7);
    redraw(graphEl, run.steps, () => fill(graphEl, dagSvg(definition, run, { onStep: focusStep, label: `Graph of run ${runId}` })));
    redraw(stepsEl, run.steps, () => fill(stepsEl, stepsTable(run)));
    keepFocus(timelineEl, () => fill(timelineEl, timeline(run)));
    // The history is append-only: its length and last entry say whether it grew.
    const historyKey = [history.length, history.length ? history[history.length - 1].seq : null];
    const stepRows = history.filter((e) => !e.kind.startsWith("run.") || e.kind === "run.cancel_requested");
    redraw(eventsEl, historyKey, () =>
      fill(
        eventsEl,
        table(
          [
            { label: "At", cell: (e) => timeEl(e.at) },
            { label: "Step", cell: (e) => describe(e).step },
            { label: "What", cell: (e) => describe(e).what },
            { label: "Detail", cell: (e) => describe(e).detail },
          ],
          stepRows,
          { caption: "Attempts, waits, retries, signals and events", empty: "Nothing has happened yet.", rowKey: (e) => String(e.seq) },
        ),
      ),
    );
    redraw(ioEl, [run.input, run.output, run.error, ended], () => fill(
      ioEl,
      h("div", {}, h("h3", {}, "Input"), jsonBlock(run.input, "Run input")),
      h("div", {}, h("h3", {}, "Output"), run.output === null && !ended ? h("p", { class: "empty" }, "Not finished yet.") : jsonBlock(run.output, "Run output")),
      run.error ? h("div", {}, h("h3", {}, "Error"), jsonBlock(run.error, "Run error")) : null,
    ));
    redraw(historyEl, historyKey, () =>
      fill(
        historyEl,
        table(
          [
            { label: "#", cell: (e) => String(e.seq), class: "num" },
            { label: "At", cell: (e) => timeEl(e.at) },
            { label: "Kind", cell: (e) => h("span", { class: "mono" }, e.kind) },
            { label: "Data", cell: (e) => h("code", { class: "data" }, e.data === null ? "" : pretty(e.data).replace(/\s+/g, " ")) },
          ],
          history,
          { caption: "The run's history, oldest first", rowKey: (e) => String(e.seq) },
        ),
      ),
    );
  }

  async function refresh() {
    const [fresh, entries] = await Promise.all([
      api(`/v1/runs/${encodeURIComponent(runId)}`),
      api(`/v1/runs/${encodeURIComponent(runId)}/history`),
    ]);
    if (!ctx.current()) return;
    run = fresh;
    history = entries;
    if (run.status !== lastStatus) {
      announce(`Run ${statusWord(run.status)}`);
      lastStatus = run.status;
    }
    draw();
  }

  await refresh();
  ctx.every(1000, async () => {
    if (!isTerminal(run.status)) await refresh();
  });
}
