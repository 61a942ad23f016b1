/** Loading the golden vectors of tests/contract/vectors/ (shared with the Python SDK and the server). */

import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

function vectorsDir(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const candidate = join(dir, "tests", "contract", "vectors");
    if (existsSync(candidate)) return candidate;
    const parent = dirname(dir);
    if (parent === dir) throw new Error("tests/contract/vectors not found above " + fileURLToPath(import.meta.url));
    dir = parent;
  }
}

/** The directory of the vectors. */
export const VECTORS = vectorsDir();

/** One vector file, parsed. */
// eslint-disable-next-line @typescript-eslint/no-unnecessary-type-parameters
export function load<T = Record<string, unknown>>(name: string): T {
  return JSON.parse(readFileSync(join(VECTORS, `${name}.json`), "utf8")) as T;
}
