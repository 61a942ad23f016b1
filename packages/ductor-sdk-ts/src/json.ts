/**
 * JSON exactly as the bridge protocol writes it: a strict reader and a writer
 * whose bytes equal the Python SDK's (msgspec's compact encoding). No I/O.
 *
 * Reading (RFC 8259, as strict as msgspec): no trailing commas, comments,
 * `NaN` or raw control characters in strings; a lone surrogate escape is
 * refused; an integer literal outside the safe range becomes a `bigint` (so
 * `18446744073709551615` survives a round trip), a number out of the double
 * range is refused; a repeated key keeps its last value; `__proto__` is an
 * ordinary key. Nesting is bounded by {@link MAX_DEPTH}.
 *
 * Writing (msgspec's format): compact, UTF-8 as is (no `\u` escapes but
 * control characters), integers as digits, other numbers with the shortest
 * round-trip digits in positional notation for exponents -5..15 (with `.0`
 * when integral) and `1.5e300`-style otherwise, `NaN` and infinities as null.
 * A lone surrogate, which msgspec refuses to write and every reader here
 * refuses, is written as U+FFFD, so nothing written fails to read back;
 * {@link toJson} refuses values holding one before they get that far.
 *
 * Two differences are JavaScript's own and keep the JSON value the same: a
 * number read as `1.0` is written `1` (JavaScript has one number type), and
 * an object's array-index-like keys ("1", "42") come first (JavaScript's
 * property order).
 */

/** A JSON value as the SDK reads and writes it (`bigint` for integers beyond 2^53). */
export type Json = null | boolean | number | bigint | string | Json[] | JsonObject;

/** A JSON object. */
export interface JsonObject {
  [key: string]: Json;
}

/** Values that `JSON.stringify` drops from objects (and turns into null in arrays). */
type Dropped = undefined | symbol | ((...args: never[]) => unknown);

/**
 * The type a value has once it went through JSON, as a step's result comes
 * back on replay: `Date` becomes `string` (through `toJSON`), functions and
 * `undefined` properties disappear, `Map` and `Set` become empty objects.
 */
export type Jsonify<T> = unknown extends T
  ? Json
  : T extends { toJSON(...args: never[]): infer R }
    ? Jsonify<R>
    : T extends Json
      ? T
    : T extends string | number | boolean | bigint | null
      ? T
      : T extends Dropped
        ? never
        : T extends ReadonlyMap<unknown, unknown> | ReadonlySet<unknown>
          ? Record<string, never>
          : T extends readonly unknown[]
            ? { -readonly [K in keyof T]: [Jsonify<T[K]>] extends [never] ? null : Jsonify<T[K]> }
            : T extends object
              ? {
                  -readonly [K in keyof T as K extends string
                    ? [Jsonify<T[K]>] extends [never]
                      ? never
                      : K
                    : never]: Jsonify<T[K]>;
                }
              : never;

/** The deepest nesting of arrays and objects the reader accepts. */
export const MAX_DEPTH = 256;

/** A JSON text that does not parse, or a value that does not fit where it goes. */
export class JsonError extends Error {
  override readonly name = "JsonError";
}

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

// ---------------------------------------------------------------- reading

/** The kind of a JSON value, in msgspec's words (for error messages). */
export function kindOf(value: unknown): string {
  if (value === null) return "null";
  if (typeof value === "string") return "str";
  if (typeof value === "boolean") return "bool";
  if (typeof value === "bigint") return "int";
  if (typeof value === "number") return Number.isInteger(value) ? "int" : "float";
  if (Array.isArray(value)) return "array";
  return "object";
}

/** A number token: its text and whether it is an integer literal. */
export interface NumberToken {
  readonly text: string;
  readonly integer: boolean;
}

/**
 * A cursor over one JSON text. The wire decoders drive it field by field (so a
 * typed field sees whether its number was written as an integer); `value()`
 * reads any value.
 */
export class JsonReader {
  pos = 0;

  constructor(readonly text: string) {}

  /** Fail at the current position. */
  fail(message: string): never {
    throw new JsonError(`JSON is malformed: ${message} (character ${this.pos})`);
  }

  /** Skip whitespace; return the next character code (NaN at the end). */
  peek(): number {
    const text = this.text;
    let pos = this.pos;
    for (;;) {
      const c = text.charCodeAt(pos);
      if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) pos++;
      else break;
    }
    this.pos = pos;
    return text.charCodeAt(pos);
  }

  /** Consume `char` (after whitespace) or fail. */
  expect(char: number, what: string): void {
    if (this.peek() !== char) this.fail(`expected ${what}`);
    this.pos++;
  }

  /** Fail unless only whitespace is left. */
  end(): void {
    if (!Number.isNaN(this.peek())) this.fail("trailing characters");
  }

  /** Read any JSON value. */
  value(depth = 0): Json {
    const c = this.peek();
    switch (c) {
      case 0x7b: // {
        return this.object(depth + 1);
      case 0x5b: // [
        return this.array(depth + 1);
      case 0x22: // "
        return this.string();
      case 0x74: // t
        return this.literal("true", true);
      case 0x66: // f
        return this.literal("false", false);
      case 0x6e: // n
        return this.literal("null", null);
      default:
        if (c === 0x2d || (c >= 0x30 && c <= 0x39)) return numberValue(this.number());
        return this.fail(Number.isNaN(c) ? "unexpected end of input" : "invalid character");
    }
  }

  /** Read `true`, `false` or `null`. */
  literal<T>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.pos)) this.fail("invalid character");
    this.pos += word.length;
    return value;
  }

  /** Iterate an object's keys; the callback must consume the value. */
  entries(depth: number, each: (key: string) => void): void {
    if (depth > MAX_DEPTH) this.fail(`nested deeper than ${MAX_DEPTH}`);
    this.expect(0x7b, "'{'");
    if (this.peek() === 0x7d) {
      this.pos++;
      return;
    }
    for (;;) {
      if (this.peek() !== 0x22) this.fail("expected a string key");
      const key = this.string();
      this.expect(0x3a, "':'");
      each(key);
      const c = this.peek();
      this.pos++;
      if (c === 0x7d) return;
      if (c !== 0x2c) {
        this.pos--;
        this.fail("expected ',' or '}'");
      }
      if (this.peek() === 0x7d) this.fail("trailing comma in object");
    }
  }

  /** Iterate an array's items; the callback must consume each item. */
  items(depth: number, each: (index: number) => void): void {
    if (depth > MAX_DEPTH) this.fail(`nested deeper than ${MAX_DEPTH}`);
    this.expect(0x5b, "'['");
    if (this.peek() === 0x5d) {
      this.pos++;
      return;
    }
    for (let index = 0; ; index++) {
      each(index);
      const c = this.peek();
      this.pos++;
      if (c === 0x5d) return;
      if (c !== 0x2c) {
        this.pos--;
        this.fail("expected ',' or ']'");
      }
      if (this.peek() === 0x5d) this.fail("trailing comma in array");
    }
  }

  private object(depth: number): JsonObject {
    const out: JsonObject = {};
    this.entries(depth, (key) => {
      const item = this.value(depth);
      if (key === "__proto__") {
        Object.defineProperty(out, key, {
          value: item,
          enumerable: true,
          writable: true,
          configurable: true,
        });
      } else {
        out[key] = item;
      }
    });
    return out;
  }

  private array(depth: number): Json[] {
    const out: Json[] = [];
    this.items(depth, () => out.push(this.value(depth)));
    return out;
  }

  /** Read a string (the cursor is on its opening quote). */
  string(): string {
    const text = this.text;
    let pos = this.pos + 1;
    let start = pos;
    let out = "";
    for (;;) {
      const c = text.charCodeAt(pos);
      if (c === 0x22) {
        out += text.slice(start, pos);
        this.pos = pos + 1;
        return out;
      }
      if (c === 0x5c) {
        out += text.slice(start, pos);
        const e = text.charCodeAt(pos + 1);
        pos += 2;
        switch (e) {
          case 0x22:
            out += '"';
            break;
          case 0x5c:
            out += "\\";
            break;
          case 0x2f:
            out += "/";
            break;
          case 0x62:
            out += "\b";
            break;
          case 0x66:
            out += "\f";
            break;
          case 0x6e:
            out += "\n";
            break;
          case 0x72:
            out += "\r";
            break;
          case 0x74:
            out += "\t";
            break;
          case 0x75: {
            const unit = this.hex4(pos);
            pos += 4;
            if (unit >= 0xd800 && unit <= 0xdbff) {
              if (text.charCodeAt(pos) !== 0x5c || text.charCodeAt(pos + 1) !== 0x75) {
                this.pos = pos;
                this.fail("lone surrogate in \\u escape");
              }
              const low = this.hex4(pos + 2);
              if (low < 0xdc00 || low > 0xdfff) {
                this.pos = pos;
                this.fail("lone surrogate in \\u escape");
              }
              pos += 6;
              out += String.fromCharCode(unit, low);
            } else if (unit >= 0xdc00 && unit <= 0xdfff) {
              this.pos = pos;
              this.fail("lone surrogate in \\u escape");
            } else {
              out += String.fromCharCode(unit);
            }
            break;
          }
          default:
            this.pos = pos - 1;
            this.fail("invalid escape character in string");
        }
        start = pos;
        continue;
      }
      if (c < 0x20 || Number.isNaN(c)) {
        this.pos = pos;
        this.fail(Number.isNaN(c) ? "unterminated string" : "invalid character in string");
      }
      pos++;
    }
  }

  private hex4(pos: number): number {
    const digits = this.text.slice(pos, pos + 4);
    if (!/^[0-9a-fA-F]{4}$/.test(digits)) {
      this.pos = pos;
      this.fail("invalid \\u escape");
    }
    return parseInt(digits, 16);
  }

  /** Read a number token (the cursor is on its first character). */
  number(): NumberToken {
    const text = this.text;
    const start = this.pos;
    let pos = start;
    let integer = true;
    if (text.charCodeAt(pos) === 0x2d) pos++;
    const first = text.charCodeAt(pos);
    if (first === 0x30) {
      pos++;
    } else if (first >= 0x31 && first <= 0x39) {
      while (isDigit(text.charCodeAt(pos))) pos++;
    } else {
      this.pos = pos;
      this.fail("invalid number");
    }
    if (isDigit(text.charCodeAt(pos))) {
      this.pos = pos;
      this.fail("invalid number");
    }
    if (text.charCodeAt(pos) === 0x2e) {
      integer = false;
      pos++;
      if (!isDigit(text.charCodeAt(pos))) {
        this.pos = pos;
        this.fail("invalid number");
      }
      while (isDigit(text.charCodeAt(pos))) pos++;
    }
    const e = text.charCodeAt(pos);
    if (e === 0x65 || e === 0x45) {
      integer = false;
      pos++;
      const sign = text.charCodeAt(pos);
      if (sign === 0x2b || sign === 0x2d) pos++;
      if (!isDigit(text.charCodeAt(pos))) {
        this.pos = pos;
        this.fail("invalid number");
      }
      while (isDigit(text.charCodeAt(pos))) pos++;
    }
    this.pos = pos;
    return { text: text.slice(start, pos), integer };
  }
}

function isDigit(c: number): boolean {
  return c >= 0x30 && c <= 0x39;
}

/** The value of a number token: a safe integer or float as `number`, a bigger integer as `bigint`. */
export function numberValue(token: NumberToken): number | bigint {
  if (token.integer) {
    if (token.text.length < 16) return Number(token.text) || 0; // `|| 0`: "-0" is 0
    const big = BigInt(token.text);
    return big > MAX_SAFE || big < -MAX_SAFE ? big : Number(big);
  }
  const value = Number(token.text);
  if (!Number.isFinite(value)) throw new JsonError(`Number out of range: ${token.text}`);
  return value;
}

const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** Decode UTF-8 bytes strictly (invalid sequences are an error). */
export function utf8(bytes: Uint8Array): string {
  try {
    return UTF8.decode(bytes);
  } catch {
    throw new JsonError("the body is not valid UTF-8");
  }
}

/** Parse one JSON text (a string, or UTF-8 bytes) into a {@link Json} value. */
export function parseJson(input: string | Uint8Array): Json {
  const reader = new JsonReader(typeof input === "string" ? input : utf8(input));
  const value = reader.value();
  reader.end();
  return value;
}

// ---------------------------------------------------------------- writing

/** The msgspec text of a number. */
export function formatNumber(value: number | bigint): string {
  if (typeof value === "bigint") return value.toString();
  if (!Number.isFinite(value)) return "null";
  if (Number.isInteger(value) && Math.abs(value) <= Number.MAX_SAFE_INTEGER) {
    return value === 0 ? "0" : String(value);
  }
  return formatFloat(value);
}

/** A double in msgspec's notation: shortest digits, positional for exponents -5..15. */
export function formatFloat(value: number): string {
  const [mantissa = "", exp = "0"] = value.toExponential().split("e");
  const negative = mantissa.startsWith("-");
  const digits = mantissa.replace("-", "").replace(".", "");
  const exponent = Number(exp);
  const sign = negative ? "-" : "";
  if (exponent < -5 || exponent > 15) {
    const rest = digits.slice(1);
    return `${sign}${digits[0] ?? "0"}${rest ? "." + rest : ""}e${exponent}`;
  }
  if (exponent < 0) return `${sign}0.${"0".repeat(-exponent - 1)}${digits}`;
  const whole = digits.slice(0, exponent + 1).padEnd(exponent + 1, "0");
  const fraction = digits.slice(exponent + 1);
  return `${sign}${whole}.${fraction || "0"}`;
}

/** Write a {@link Json} value as the protocol's compact text. */
export function stringifyJson(value: Json): string {
  const out: string[] = [];
  write(value, out);
  return out.join("");
}

// A high surrogate not followed by a low one, or a low one not after a high one.
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;
const LONE_SURROGATES = new RegExp(LONE_SURROGATE.source, "g");

/** Whether `text` holds a lone surrogate (a UTF-16 string that is not valid Unicode). */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text);
}

/** `text` with each lone surrogate replaced by U+FFFD. */
export function wellFormed(text: string): string {
  return hasLoneSurrogate(text) ? text.replace(LONE_SURROGATES, "\uFFFD") : text;
}

/** Append the text of `value` to `out`. */
export function write(value: Json, out: string[]): void {
  if (value === null) {
    out.push("null");
  } else if (typeof value === "string") {
    out.push(JSON.stringify(wellFormed(value)));
  } else if (typeof value === "number" || typeof value === "bigint") {
    out.push(formatNumber(value));
  } else if (typeof value === "boolean") {
    out.push(value ? "true" : "false");
  } else if (Array.isArray(value)) {
    out.push("[");
    for (let i = 0; i < value.length; i++) {
      if (i > 0) out.push(",");
      write(value[i] ?? null, out);
    }
    out.push("]");
  } else {
    out.push("{");
    let first = true;
    for (const key of Object.keys(value)) {
      if (!first) out.push(",");
      first = false;
      out.push(JSON.stringify(wellFormed(key)), ":");
      write(value[key] ?? null, out);
    }
    out.push("}");
  }
}

// ---------------------------------------------------------------- JSON form of JS values

/**
 * The JSON form of a JavaScript value, as `JSON.stringify` would see it
 * (`toJSON` is called, `undefined`, functions and symbols are dropped from
 * objects and become null in arrays, non-finite numbers become null), except
 * that a `bigint` stays a `bigint`. A top-level `undefined` is null. A
 * string or key holding a lone surrogate is not JSON (msgspec refuses to
 * write it) unless `replace` asks for U+FFFD in its place.
 *
 * @throws TypeError on a cycle, nesting deeper than {@link MAX_DEPTH}, or a
 *   lone surrogate.
 */
export function toJson(value: unknown, options: { readonly replace?: boolean } = {}): Json {
  return convert(value, "", new Set(), 0, options.replace === true) ?? null;
}

function text(value: string, replace: boolean): string {
  if (!hasLoneSurrogate(value)) return value;
  if (replace) return wellFormed(value);
  throw new TypeError(`value holds a lone surrogate (not valid Unicode): ${JSON.stringify(value.slice(0, 40))}`);
}

function convert(value: unknown, key: string, seen: Set<object>, depth: number, replace: boolean): Json | undefined {
  if (depth > MAX_DEPTH) throw new TypeError(`value is nested deeper than ${MAX_DEPTH}`);
  if (value !== null && (typeof value === "object" || typeof value === "bigint")) {
    const toJSON = (value as { toJSON?: unknown }).toJSON;
    if (typeof toJSON === "function") value = (toJSON as (key: string) => unknown).call(value, key);
  }
  if (value === null) return null;
  switch (typeof value) {
    case "string":
      return text(value, replace);
    case "boolean":
    case "bigint":
      return value;
    case "number":
      return Number.isFinite(value) ? value : null;
    case "undefined":
    case "function":
    case "symbol":
      return undefined;
    default:
      break;
  }
  const obj = value;
  if (obj instanceof Number || obj instanceof String || obj instanceof Boolean) {
    return convert(obj.valueOf(), key, seen, depth, replace);
  }
  if (seen.has(obj)) throw new TypeError("value contains a cycle");
  seen.add(obj);
  try {
    if (Array.isArray(obj)) {
      const items: unknown[] = obj;
      return items.map((item, i) => convert(item, String(i), seen, depth + 1, replace) ?? null);
    }
    const out: JsonObject = {};
    for (const given of Object.keys(obj)) {
      const item = convert((obj as Record<string, unknown>)[given], given, seen, depth + 1, replace);
      if (item === undefined) continue;
      const name = text(given, replace);
      if (name === "__proto__") {
        Object.defineProperty(out, name, {
          value: item,
          enumerable: true,
          writable: true,
          configurable: true,
        });
      } else {
        out[name] = item;
      }
    }
    return out;
  } finally {
    seen.delete(obj);
  }
}
