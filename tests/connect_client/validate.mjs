// Checks JSON messages against the schemas of proto/, with protobuf-es (strict: an
// unknown field, a wrong type or a bad value is an error). Reads a JSON array of
// {"type": "ductor.v1.GetRunResponse", "json": {...}} on stdin; prints a JSON array
// of the problems found (empty when every message parses).
import { readFileSync } from "node:fs";
import { readdir } from "node:fs/promises";
import { createRegistry, fromJson } from "@bufbuild/protobuf";

const generated = new URL("./_gen/ductor/v1/", import.meta.url);
const files = [];
for (const name of await readdir(generated)) {
  const module = await import(new URL(name, generated));
  files.push(...Object.entries(module).filter(([key]) => key.startsWith("file_")).map(([, f]) => f));
}
const registry = createRegistry(...files);
const messages = JSON.parse(readFileSync(0, "utf8"));
const problems = [];
for (const { type, json } of messages) {
  const schema = registry.getMessage(type);
  if (!schema) {
    problems.push(`${type}: no such message`);
    continue;
  }
  try {
    fromJson(schema, json, { registry });
  } catch (error) {
    problems.push(`${type}: ${error.message}`);
  }
}
process.stdout.write(JSON.stringify(problems));
