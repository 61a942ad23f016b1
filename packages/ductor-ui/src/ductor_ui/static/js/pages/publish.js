// Publish a workflow: paste a definition, validate it (problems on their lines),
// publish it as the family's next version.

import { api, idempotencyKey } from "../api.js";
import { dagSvg } from "../dag.js";
import { errorBox, field, fill, h, link, parseJson } from "../dom.js";
import { jsonWithProblems } from "../jsonview.js";
import { problemsList } from "./workflow.js";

const EXAMPLE = {
  family_slug: "hello",
  title: "Hello",
  steps: [
    { ref: "greet", type: "STEP_TYPE_DATAFLOW", title: "Build greeting", args: { operation: "project", project: { message: "'hello ' + string(input.name)" } } },
    { ref: "pause", type: "STEP_TYPE_WAIT", title: "Short delay", args: { duration: "1s" } },
  ],
  edges: [{ source_ref: "greet", target_ref: "pause", type: "EDGE_TYPE_SUCCESS" }],
};

export async function render(main, ctx) {
  ctx.title("Publish a workflow");
  const text = h("textarea", { name: "definition", rows: "18", spellcheck: "false", class: "code-input" }, JSON.stringify(EXAMPLE, null, 2));
  const result = h("div", { id: "publish-result" });
  const preview = h("div", { id: "publish-preview" });
  const validateButton = h("button", { type: "button", class: "secondary" }, "Validate");
  const publishButton = h("button", { type: "submit" }, "Publish");
  let publishKey = idempotencyKey();

  const read = () => {
    const definition = parseJson(text.value, "The definition");
    if (definition === undefined) throw Object.assign(new Error("The definition is empty."), { code: "input.empty" });
    return definition;
  };

  const validate = async () => {
    let definition;
    try {
      definition = read();
    } catch (err) {
      fill(result, errorBox(err));
      fill(preview);
      return null;
    }
    const answer = await api("/v1/workflows/validate", { method: "POST", body: definition });
    fill(result, await problemsList(answer.problems));
    const graph = answer.valid && Array.isArray(definition.steps)
      ? h("div", { class: "scroll-x graph" }, dagSvg(definition, null, { label: "Graph of the definition" }))
      : null;
    fill(preview, graph, jsonWithProblems(definition, answer.problems, "The definition, as validated"));
    return answer;
  };

  validateButton.addEventListener("click", () => validate().catch((err) => fill(result, errorBox(err))));
  const form = h(
    "form", { class: "stack-form", "aria-labelledby": "publish-title" },
    field("Definition (JSON)", text, "family_slug, title, steps and edges; see docs/concepts.md.").row,
    h("div", { class: "buttons" }, validateButton, publishButton),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    publishButton.disabled = true;
    try {
      const definition = read();
      const published = await api("/v1/workflows", { method: "POST", body: definition, idempotency: publishKey });
      publishKey = idempotencyKey();
      fill(
        result,
        h(
          "p", { class: "ok", role: "status" },
          published.created ? `Published ${published.family_slug} version ${published.version}. ` : `Already published as ${published.family_slug} version ${published.version}. `,
          link(`#/workflows/${encodeURIComponent(published.family_slug)}`, `Open ${published.family_slug}`),
        ),
      );
      fill(preview);
    } catch (err) {
      if (err.code === "definition.invalid" && Array.isArray(err.details)) {
        await validate().catch(() => fill(result, errorBox(err)));
      } else {
        fill(result, errorBox(err));
      }
    } finally {
      publishButton.disabled = false;
    }
  });
  fill(main, h("h1", { id: "publish-title" }, "Publish a workflow"), form, result, preview);
}
