// Sign in with an API key: checked against the API, then kept for this tab only.

import { api, setKey } from "../api.js";
import { errorBox, fill, h } from "../dom.js";

export async function render(main, ctx) {
  ctx.title("Sign in");
  const input = h("input", {
    id: "api-key", name: "api-key", type: "password", autocomplete: "off", spellcheck: "false",
    required: true, "aria-describedby": "api-key-hint",
  });
  const status = h("div", { id: "signin-status" });
  const button = h("button", { type: "submit" }, "Sign in");
  const form = h(
    "form", { class: "signin", "aria-labelledby": "signin-title" },
    h("h1", { id: "signin-title" }, "Sign in to Ductor"),
    h(
      "div", { class: "field" },
      h("label", { for: "api-key" }, "API key"),
      input,
      h(
        "p", { class: "hint", id: "api-key-hint" },
        "A key such as dk_… (ductor dev saves one to .ductor/api_key; ductor keys create mints one). ",
        "It stays in this browser tab only and is sent to this server's API as a bearer token.",
      ),
    ),
    button,
    status,
  );
  if (ctx.query.get("expired")) {
    fill(status, h("p", { class: "notice", role: "status" }, "The server no longer accepts the key: sign in again."));
  }
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const key = input.value.trim();
    if (!key) return;
    if (!/^[\x21-\x7e]+$/.test(key)) {
      // A bearer token is printable ASCII: this key cannot even be sent (fetch refuses
      // the header, which would read as an unreachable server), and would be refused.
      fill(
        status,
        h(
          "div", { class: "error", role: "alert" }, h("strong", {}, "auth.unauthenticated"),
          ": this is not an API key (it has spaces or characters no key has). Check it and try again.",
        ),
      );
      input.focus();
      input.select();
      return;
    }
    button.disabled = true;
    fill(status, h("p", { role: "status" }, "Checking the key…"));
    try {
      // Any authenticated read tells whether the key is accepted.
      await api("/v1/workflows", { key });
      setKey(key);
      input.value = "";
      // `next` is the address (path and query) the tab was sent here from.
      const next = ctx.query.get("next") || "";
      const back = next.startsWith("/") && !/^\/signin(\?|$)/.test(next);
      ctx.navigate(`#${back ? next : "/runs"}`);
    } catch (err) {
      let shown;
      if (err.status === 401) {
        shown = h("div", { class: "error", role: "alert" }, h("strong", {}, err.code), ": the server refused this key. Check it and try again.");
      } else if (err.status === 403) {
        // A producer's key (events:send only) is valid but reads nothing, and every
        // page here reads.
        shown = h(
          "div", { class: "error", role: "alert" }, h("strong", {}, err.code),
          ": this key cannot read (the dashboard needs a key with the read, write or admin scope).",
        );
      } else {
        shown = errorBox(err);
      }
      fill(status, shown);
      input.focus();
      input.select();
    } finally {
      button.disabled = false;
    }
  });
  fill(main, form);
  input.focus();
}
