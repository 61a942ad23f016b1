/**
 * docs/sdk-typescript.md's TypeScript blocks are the files of examples/docs/
 * (compiled with the tests, so they type-check): this test checks the page
 * and the files agree, and runs every one of them.
 */

import assert from "node:assert/strict";
import { existsSync, readFileSync, readdirSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";

const PACKAGE = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

function page(): string {
  let dir = PACKAGE;
  while (!existsSync(join(dir, "docs", "sdk-typescript.md"))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error("docs/sdk-typescript.md not found");
    dir = parent;
  }
  return readFileSync(join(dir, "docs", "sdk-typescript.md"), "utf8");
}

const BLOCKS = [...page().matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1] ?? "");
const FILES = readdirSync(join(PACKAGE, "examples", "docs")).filter((name) => name.endsWith(".ts"));

test("every TypeScript block of the page is a file of examples/docs, and every file is on the page", () => {
  assert.ok(BLOCKS.length >= 5);
  const named = BLOCKS.map((block) => {
    const match = /^\/\/ examples\/docs\/([\w-]+\.ts)\n/.exec(block);
    assert.ok(match, `a block does not start with its file name: ${block.slice(0, 80)}`);
    const name = match[1] ?? "";
    assert.equal(block, readFileSync(join(PACKAGE, "examples", "docs", name), "utf8"), `${name} differs from the page`);
    return name;
  });
  assert.deepEqual([...named].sort(), [...FILES].sort());
});

for (const name of FILES) {
  test(`examples/docs/${name} runs`, async () => {
    await import(pathToFileURL(join(PACKAGE, "build", "examples", "docs", name.replace(/\.ts$/, ".js"))).href);
  });
}
