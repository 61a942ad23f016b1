// The dashboard's shell: the hash router, the navigation and the sign-in gate.
// Pages are modules exporting `render(main, ctx)`; `ctx.every(ms, fn)` polls the
// API while the page is shown and stops when the user leaves it.

import { apiPaths, clearKey, getKey, onUnauthenticated } from "./api.js";
import { errorBox, fill, h } from "./dom.js";
import * as ai from "./pages/ai.js";
import * as decision from "./pages/decision.js";
import * as inbox from "./pages/inbox.js";
import * as ledger from "./pages/ledger.js";
import * as publish from "./pages/publish.js";
import * as receipt from "./pages/receipt.js";
import * as receipts from "./pages/receipts.js";
import * as routing from "./pages/routing.js";
import * as run from "./pages/run.js";
import * as runs from "./pages/runs.js";
import * as shadow from "./pages/shadow.js";
import * as signin from "./pages/signin.js";
import * as tryRoute from "./pages/try.js";
import * as workflow from "./pages/workflow.js";
import * as workflows from "./pages/workflows.js";

const ROUTES = [
  [/^\/signin$/, signin, null],
  [/^\/runs$/, runs, "runs"],
  [/^\/runs\/([^/]+)$/, run, "runs"],
  [/^\/workflows$/, workflows, "workflows"],
  [/^\/workflows\/new$/, publish, "workflows"],
  [/^\/workflows\/([^/]+)$/, workflow, "workflows"],
  [/^\/routing$/, routing, "routing"],
  [/^\/routing\/try$/, tryRoute, "routing"],
  [/^\/routing\/pools\/([^/]+)\/shadow$/, shadow, "routing"],
  [/^\/decisions\/([^/]+)$/, decision, "routing"],
  [/^\/ledger$/, ledger, "ledger"],
  [/^\/receipts$/, receipts, "receipts"],
  [/^\/receipts\/([^/]+)$/, receipt, "receipts"],
  [/^\/inbox$/, inbox, "inbox"],
  [/^\/ai$/, ai, "ai"],
];

// Each section and the API path it needs: a section whose API this server does
// not document is left out of the navigation.
const SECTIONS = [
  ["runs", "Runs", "#/runs", "/v1/runs"],
  ["workflows", "Workflows", "#/workflows", "/v1/workflows"],
  ["routing", "Routing", "#/routing", "/v1/pools"],
  ["ledger", "Ledger", "#/ledger", "/v1/accounts"],
  ["receipts", "Receipts", "#/receipts", "/v1/receipts"],
  ["inbox", "Inbox", "#/inbox", "/v1/inbox/notifications"],
  ["ai", "AI", "#/ai", "/v1/ai/requests"],
];

let leaving = [];
let firstRender = true;
let generation = 0;

function leave() {
  for (const fn of leaving) {
    try {
      fn();
    } catch {
      /* a page's cleanup must not stop navigation */
    }
  }
  leaving = [];
}

function parseHash() {
  const raw = window.location.hash.replace(/^#/, "") || "/runs";
  const [path, query = ""] = raw.split("?");
  return { path, query: new URLSearchParams(query), raw };
}

function decodeParam(text) {
  try {
    return decodeURIComponent(text);
  } catch {
    return null;
  }
}

export function navigate(hash) {
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

async function renderNav(active) {
  const nav = document.getElementById("nav");
  const session = document.getElementById("session");
  if (!getKey()) {
    fill(nav);
    fill(session);
    return;
  }
  const paths = await apiPaths();
  const items = SECTIONS.filter(([, , , need]) => !paths || paths.has(need));
  fill(
    nav,
    h(
      "ul", {},
      items.map(([id, label, href]) =>
        h("li", {}, h("a", { href, "aria-current": id === active ? "page" : null }, label)),
      ),
    ),
  );
  fill(
    session,
    h(
      "button", {
        type: "button", class: "secondary",
        onClick: () => {
          clearKey();
          navigate("#/signin");
        },
      },
      "Sign out",
    ),
  );
}

async function route() {
  leave();
  generation += 1;
  const mine = generation;
  const { path, query, raw } = parseHash();
  const main = document.getElementById("main");
  if (!getKey() && path !== "/signin") {
    // The whole address, filters included, is where signing in leads back to.
    window.location.replace(`#/signin?next=${encodeURIComponent(raw)}`);
    return;
  }
  let match = null;
  for (const [pattern, page, section] of ROUTES) {
    const m = pattern.exec(path);
    if (m) {
      // An address with a broken %-escape names no object: it is a page not found,
      // not an error that leaves the previous page on the screen.
      const params = m.slice(1).map(decodeParam);
      if (!params.includes(null)) match = { page, section, params };
      break;
    }
  }
  await renderNav(match ? match.section : null);
  if (mine !== generation) return;
  fill(main);
  if (!match) {
    document.title = "Not found · Ductor";
    fill(main, h("h1", {}, "Not found"), h("p", {}, "No such page. ", h("a", { href: "#/runs" }, "Go to runs")));
    return;
  }
  const ctx = {
    params: match.params,
    query,
    navigate,
    current: () => mine === generation,
    onLeave: (fn) => leaving.push(fn),
    every(ms, fn) {
      let timer = null;
      let stopped = false;
      const tick = async () => {
        if (stopped) return;
        if (!document.hidden) {
          try {
            await fn();
          } catch {
            /* the page shows its own errors; keep polling */
          }
        }
        if (!stopped) timer = window.setTimeout(tick, ms);
      };
      timer = window.setTimeout(tick, ms);
      const stop = () => {
        stopped = true;
        window.clearTimeout(timer);
      };
      leaving.push(stop);
      return stop;
    },
    title(text) {
      document.title = `${text} · Ductor`;
    },
  };
  // After a change of page (not the first load, where the skip link leads), move
  // focus to the content so keyboard and screen reader users start there.
  if (!firstRender) main.focus({ preventScroll: true });
  firstRender = false;
  try {
    await match.page.render(main, ctx);
  } catch (err) {
    if (mine === generation) fill(main, h("h1", {}, "Something went wrong"), errorBox(err));
  }
}

onUnauthenticated(() => {
  const { path, raw } = parseHash();
  if (path !== "/signin") window.location.replace(`#/signin?next=${encodeURIComponent(raw)}&expired=1`);
});

document.getElementById("skip-link").addEventListener("click", (event) => {
  event.preventDefault();
  document.getElementById("main").focus();
});
window.addEventListener("hashchange", route);
route();
