/**
 * Durations: `"250ms"`, `"2s"`, `"1h30m"`, `"7d"` to and from milliseconds, in
 * the canonical form the Python SDK writes (`"90s"` is sent as `"1m30s"`). No I/O.
 */

import { DurationError } from "./errors.js";

/** A unit of a duration string. */
export type DurationUnit = "ms" | "s" | "m" | "h" | "d";

type Part = `${number}${DurationUnit}`;

/**
 * A duration string of one to four parts, checked by the compiler:
 * `"10m"`, `"1h30m"`, `"1d2h3m4s"`. (`"10 minutes"` does not compile.)
 */
export type DurationString = Part | `${Part}${Part}` | `${Part}${Part}${Part}` | `${Part}${Part}${Part}${Part}`;

/** A duration: a {@link DurationString} or a number of milliseconds. */
export type Duration = DurationString | number;

const PART = /(\d+(?:\.\d+)?)(ms|s|m|h|d)/y;
const UNIT_MS: Record<DurationUnit, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const MAX_MS = 36_500 * 86_400_000;
const MAX_TEXT_LENGTH = 64;

/**
 * Parse a duration such as `"2s"`, `"1h30m"`, `"500ms"` or `"7d"` into milliseconds.
 *
 * @throws DurationError the text is empty, too long, uses an unknown unit, or
 *   is longer than 100 years.
 */
export function parseDuration(text: string): number {
  if (typeof text !== "string" || text === "") {
    throw new DurationError(`duration must be a non-empty string like '2s', got ${JSON.stringify(text)}`);
  }
  if (text.length > MAX_TEXT_LENGTH) {
    throw new DurationError(`duration is longer than ${MAX_TEXT_LENGTH} characters`);
  }
  let pos = 0;
  let ms = 0;
  PART.lastIndex = 0;
  for (let match = PART.exec(text); match !== null; match = PART.exec(text)) {
    ms += Number(match[1]) * UNIT_MS[match[2] as DurationUnit];
    pos = PART.lastIndex;
  }
  if (pos !== text.length) {
    throw new DurationError(
      `invalid duration '${text}': use numbers with units ms, s, m, h, d (e.g. '1h30m')`,
    );
  }
  if (ms > MAX_MS) {
    throw new DurationError(`duration '${text}' is longer than the limit of 36500d (100 years)`);
  }
  return ms;
}

/**
 * Format milliseconds as the canonical duration string (`"1h30m"`, `"250ms"`),
 * rounded to the millisecond as the Python SDK rounds (half to even).
 *
 * @throws DurationError the value is negative or not finite.
 */
export function formatDuration(milliseconds: number): string {
  if (!Number.isFinite(milliseconds)) {
    throw new DurationError(`duration must be a finite number of milliseconds, got ${milliseconds}`);
  }
  if (milliseconds > MAX_MS) throw new DurationError(`duration must be at most 100 years, got ${milliseconds}ms`);
  let millis = roundHalfEven(milliseconds);
  if (millis < 0) throw new DurationError(`duration must not be negative, got ${milliseconds}ms`);
  if (millis === 0) return "0s";
  let out = "";
  for (const unit of ["d", "h", "m", "s"] as const) {
    const size = UNIT_MS[unit];
    const count = Math.floor(millis / size);
    millis -= count * size;
    if (count) out += `${count}${unit}`;
  }
  if (millis) out += `${millis}ms`;
  return out;
}

/** Round to an integer, a half to the even neighbour, as Python's `round()` does. */
function roundHalfEven(value: number): number {
  const floor = Math.floor(value);
  const fraction = value - floor;
  if (fraction !== 0.5) return Math.round(value);
  return floor % 2 === 0 ? floor : floor + 1;
}

/** Normalize a duration (text or milliseconds) to its canonical string. */
export function canonicalDuration(value: string | number): string {
  return formatDuration(typeof value === "number" ? value : parseDuration(value));
}
