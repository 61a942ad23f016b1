// Building DOM nodes from parts, never from HTML strings: every text goes in as a text node, so
// nothing a tenant stored (titles, outputs, error messages) can become markup.

const SVG_NS = "http://www.w3.org/2000/svg";

/** h("div", {class: "x", onClick: fn}, child, [children], "text"); "svg:rect" for SVG. */
export function h(tag, props, ...children) {
  const isSvg = tag.startsWith("svg:");
  const el = isSvg ? document.createElementNS(SVG_NS, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "value" || key === "checked" || key === "selected") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** Replace an element's children. */
export function fill(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

let uid = 0;
/** A fresh id for label/aria wiring. */
export function nextId(prefix = "f") {
  uid += 1;
  return `${prefix}-${uid}`;
}

const STATUS_WORDS = [
  "succeeded", "failed", "running", "retrying", "waiting", "pending", "skipped", "cancelled",
];

/** "RUN_STATUS_SUCCEEDED" or "STEP_STATUS_WAITING" -> "succeeded". */
export function statusWord(status) {
  if (!status) return "unknown";
  const word = String(status).toLowerCase().replace(/^(run|step)_status_/, "");
  return STATUS_WORDS.includes(word) ? word : word || "unknown";
}

export function badge(status) {
  const word = statusWord(status);
  return h("span", { class: `badge status-${word}` }, word);
}

export function isTerminal(status) {
  return ["succeeded", "failed", "cancelled", "skipped"].includes(statusWord(status));
}

export function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function timeEl(iso) {
  return iso ? h("time", { datetime: iso }, fmtTime(iso)) : "";
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  const m = Math.floor(ms / 60000);
  return `${m} min ${Math.round((ms % 60000) / 1000)} s`;
}

/** Integer micros -> "12.5 USD" (exact: no floating point on the amount). */
export function fmtMicros(micros, currency = "") {
  if (micros === null || micros === undefined) return "";
  const n = BigInt(micros);
  const neg = n < 0n;
  const abs = neg ? -n : n;
  const whole = abs / 1000000n;
  let frac = (abs % 1000000n).toString().padStart(6, "0").replace(/0+$/, "");
  if (frac.length < 2) frac = frac.padEnd(2, "0");
  return `${neg ? "-" : ""}${whole}.${frac}${currency ? " " + currency : ""}`;
}

export function pretty(value) {
  return JSON.stringify(value === undefined ? null : value, null, 2);
}

export function jsonBlock(value, label) {
  return h("pre", { class: "json", tabindex: "0", "aria-label": label }, pretty(value));
}

/** A table: columns [{label, cell(row) -> node|string, class?}], rows; `caption` for readers. */
export function table(columns, rows, { caption, empty = "Nothing here yet.", rowKey } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h(
    "div", { class: "table-wrap" },
    h(
      "table", {},
      caption ? h("caption", {}, caption) : null,
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col", class: c.class }, c.label)))),
      h(
        "tbody", {},
        rows.map((row) =>
          h(
            "tr", { "data-key": rowKey ? rowKey(row) : null },
            columns.map((c, i) =>
              i === 0 ? h("th", { scope: "row", class: c.class }, c.cell(row)) : h("td", { class: c.class }, c.cell(row)),
            ),
          ),
        ),
      ),
    ),
  );
}

export function link(href, text, props = {}) {
  return h("a", { href, ...props }, text);
}

/** An error box (role=alert) for an ApiError or any Error. */
export function errorBox(err) {
  const code = err && err.code ? err.code : "error";
  const details = err && err.details;
  return h(
    "div", { class: "error", role: "alert" },
    h("strong", {}, code), ": ", err && err.message ? err.message : String(err),
    details && Object.keys(details).length ? h("pre", { class: "json" }, pretty(details)) : null,
  );
}

/** A labelled form field; returns {row, input}. */
export function field(label, input, hint) {
  const id = input.id || nextId();
  input.id = id;
  const hintId = hint ? `${id}-hint` : null;
  if (hintId) input.setAttribute("aria-describedby", hintId);
  const row = h("div", { class: "field" }, h("label", { for: id }, label), input, hint ? h("p", { class: "hint", id: hintId }, hint) : null);
  return { row, input };
}

export function select(options, value, props = {}) {
  return h(
    "select", props,
    options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)),
  );
}

/** Parse JSON typed by a user; throws an Error with a readable message. */
export function parseJson(text, what) {
  const trimmed = text.trim();
  if (!trimmed) return undefined;
  try {
    return JSON.parse(trimmed);
  } catch (exc) {
    throw Object.assign(new Error(`${what} is not valid JSON: ${exc.message}`), { code: "input.not_json" });
  }
}

/** Tell screen readers something changed (polite). */
export function announce(message) {
  const el = document.getElementById("announcer");
  if (!el) return;
  el.textContent = "";
  window.setTimeout(() => {
    el.textContent = message;
  }, 50);
}

export function section(title, ...children) {
  const id = nextId("sec");
  return h("section", { "aria-labelledby": id }, h("h2", { id }, title), children);
}
