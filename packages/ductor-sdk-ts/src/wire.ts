/**
 * A small schema language for the wire structs: each schema reads its JSON
 * strictly (as msgspec reads the Python SDK's structs: unknown fields refused,
 * required fields checked, an `int` field refuses `2.0`) and writes it with
 * every field present, in declared order, the tag first. The TypeScript types
 * of the messages are inferred from the schemas, so the two cannot drift.
 * No I/O.
 */

import { type Json, JsonError, JsonReader, kindOf, numberValue, toJson, wellFormed, write } from "./json.js";

/** How one field (or value) is read and written. */
export interface Kind<Out, In = Out, HasDefault extends boolean = boolean> {
  /** The type's name in error messages (`str`, `int`, a struct's name). */
  readonly label: string;
  /** Whether a missing field takes {@link Kind.fallback}. */
  readonly hasDefault: HasDefault;
  /** The value of a missing field. */
  fallback(): Out;
  /** Read a value at `path`. */
  read(reader: JsonReader, path: string, depth: number): Out;
  /** Append the value's text. */
  write(value: In, out: string[]): void;
}

/** The decoded type of a kind. */
export type OutOf<K> = K extends Kind<infer Out, infer _In, infer _D> ? Out : never;
/** The type a kind accepts for writing. */
export type InOf<K> = K extends Kind<infer _Out, infer In, infer _D> ? In : never;

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyKind = Kind<any, any>;
type Fields = Record<string, AnyKind>;

type OptionalKeys<F extends Fields> = {
  [K in keyof F]: F[K] extends Kind<infer _O, infer _I, true> ? K : never;
}[keyof F];
type RequiredKeys<F extends Fields> = Exclude<keyof F, OptionalKeys<F>>;
type Simplify<T> = { [K in keyof T]: T[K] } & {};

/** A decoded struct: every field present. */
export type StructOut<F extends Fields> = Simplify<{ readonly [K in keyof F]: OutOf<F[K]> }>;
/** A struct to write: fields with defaults may be left out. */
export type StructIn<F extends Fields> = Simplify<
  { readonly [K in RequiredKeys<F>]: InOf<F[K]> } & { readonly [K in OptionalKeys<F>]?: InOf<F[K]> }
>;

/** A struct's schema: its name, its fields in wire order, and its tag if any. */
export interface Struct<F extends Fields> extends Kind<StructOut<F>, StructIn<F>, false> {
  readonly name: string;
  readonly fields: F;
  readonly tag: { readonly field: string; readonly value: string } | undefined;
}

/** The decoded type of a struct schema (`Infer<typeof ExecuteRequest>`). */
export type Infer<S> = OutOf<S>;
/** The writable type of a struct schema (defaults optional). */
export type Input<S> = InOf<S>;

function mismatch(expected: string, reader: JsonReader, path: string): never {
  const got = ahead(reader);
  // Not a JSON value at all (`nope`, `nul`, `+1`): malformed, as msgspec says, not a wrong type.
  if (got === "invalid") reader.fail(Number.isNaN(reader.peek()) ? "unexpected end of input" : "invalid character");
  throw new JsonError(`Expected \`${expected}\`, got \`${got}\` - at \`${path}\``);
}

const LITERALS: Readonly<Record<number, readonly [string, string]>> = {
  0x74: ["true", "bool"],
  0x66: ["false", "bool"],
  0x6e: ["null", "null"],
};

/** The kind of the value the reader is on, without consuming it ("invalid" for no value). */
function ahead(reader: JsonReader): string {
  const c = reader.peek();
  if (c === 0x7b) return "object";
  if (c === 0x5b) return "array";
  if (c === 0x22) return "str";
  const literal = LITERALS[c];
  if (literal !== undefined) return reader.text.startsWith(literal[0], reader.pos) ? literal[1] : "invalid";
  const start = reader.pos;
  try {
    return reader.number().integer ? "int" : "float";
  } catch {
    return "invalid";
  } finally {
    reader.pos = start;
  }
}

function isNull(reader: JsonReader): boolean {
  return reader.peek() === 0x6e;
}

// ---------------------------------------------------------------- scalar kinds

/** A required string. */
export const str: Kind<string, string, false> = {
  label: "str",
  hasDefault: false,
  fallback: () => "",
  read(reader, path) {
    if (reader.peek() !== 0x22) mismatch("str", reader, path);
    return reader.string();
  },
  write(value, out) {
    if (typeof value !== "string") throw new TypeError(`expected a string, got ${typeof value}`);
    out.push(JSON.stringify(wellFormed(value)));
  },
};

/** A string that defaults to `fallback` when missing. */
export function strOr(fallback: string): Kind<string, string, true> {
  return { ...str, hasDefault: true, fallback: () => fallback };
}

function intKind<D extends boolean>(hasDefault: D, fallback: number): Kind<number, number, D> {
  return {
    label: "int",
    hasDefault,
    fallback: () => fallback,
    read(reader, path) {
      const c = reader.peek();
      if (c !== 0x2d && !(c >= 0x30 && c <= 0x39)) mismatch("int", reader, path);
      const start = reader.pos;
      const token = reader.number();
      if (!token.integer) {
        reader.pos = start;
        mismatch("int", reader, path);
      }
      const value = numberValue(token);
      if (typeof value === "bigint") {
        throw new JsonError(`Integer value out of range - at \`${path}\``);
      }
      return value;
    },
    write(value, out) {
      if (!Number.isSafeInteger(value)) throw new TypeError(`expected an integer, got ${value}`);
      out.push(String(value));
    },
  };
}

/** A required integer (a JSON integer literal within 2^53). */
export const int: Kind<number, number, false> = intKind(false, 0);

/** An integer that defaults to `fallback` when missing. */
export function intOr(fallback: number): Kind<number, number, true> {
  return intKind(true, fallback);
}

/** A required boolean. */
export const bool: Kind<boolean, boolean, false> = { ...boolOr(false), hasDefault: false };

/** A boolean that defaults to `fallback` when missing. */
export function boolOr(fallback: boolean): Kind<boolean, boolean, true> {
  return {
    label: "bool",
    hasDefault: true,
    fallback: () => fallback,
    read(reader, path) {
      const c = reader.peek();
      if (c === 0x74) return reader.literal("true", true);
      if (c === 0x66) return reader.literal("false", false);
      return mismatch("bool", reader, path);
    },
    write(value, out) {
      out.push(value ? "true" : "false");
    },
  };
}

/** A string literal: required when it is a tag, else defaulting to itself. */
export function literal<V extends string, D extends boolean>(value: V, hasDefault: D): Kind<V, V, D> {
  return {
    label: JSON.stringify(value),
    hasDefault,
    fallback: () => value,
    read(reader, path) {
      if (reader.peek() !== 0x22) mismatch("str", reader, path);
      const got = reader.string();
      if (got !== value) throw new JsonError(`Invalid value ${JSON.stringify(got)} - at \`${path}\``);
      return value;
    },
    write(_value, out) {
      out.push(JSON.stringify(value));
    },
  };
}

/** One of a closed set of strings. */
export function oneOf<const V extends readonly string[]>(values: V): Kind<V[number], V[number], false> {
  const allowed = new Set<string>(values);
  return {
    label: "str",
    hasDefault: false,
    fallback: () => values[0] as V[number],
    read(reader, path) {
      if (reader.peek() !== 0x22) mismatch("str", reader, path);
      const got = reader.string();
      if (!allowed.has(got)) throw new JsonError(`Invalid enum value ${JSON.stringify(got)} - at \`${path}\``);
      return got;
    },
    write(value, out) {
      if (!allowed.has(value)) throw new TypeError(`${JSON.stringify(value)} is not one of ${values.join(", ")}`);
      out.push(JSON.stringify(value));
    },
  };
}

/** Any JSON value (default null). Written through {@link toJson}, a lone surrogate as U+FFFD. */
export const any: Kind<Json, unknown, true> = {
  label: "any",
  hasDefault: true,
  fallback: () => null,
  read(reader, _path, depth) {
    return reader.value(depth);
  },
  write(value, out) {
    write(toJson(value, { replace: true }), out);
  },
};

/** `kind` or null (default null). */
export function nullable<O, I>(kind: Kind<O, I>): Kind<O | null, I | null | undefined, true> {
  return {
    label: `${kind.label} | None`,
    hasDefault: true,
    fallback: () => null,
    read(reader, path, depth) {
      if (isNull(reader)) return reader.literal("null", null);
      try {
        return kind.read(reader, path, depth);
      } catch (err) {
        if (err instanceof JsonError) {
          err.message = err.message.replace(`Expected \`${kind.label}\``, `Expected \`${kind.label} | null\``);
        }
        throw err;
      }
    },
    write(value, out) {
      if (value === null || value === undefined) out.push("null");
      else kind.write(value, out);
    },
  };
}

/** A list of `kind` (default empty). */
export function list<O, I>(kind: Kind<O, I>): Kind<O[], readonly I[], true>;
/** A list of `kind`, required (`list(kind, false)`). */
export function list<O, I>(kind: Kind<O, I>, hasDefault: false): Kind<O[], readonly I[], false>;
export function list<O, I>(kind: Kind<O, I>, hasDefault = true): Kind<O[], readonly I[]> {
  return {
    label: "array",
    hasDefault,
    fallback: () => [],
    read(reader, path, depth) {
      if (reader.peek() !== 0x5b) mismatch("array", reader, path);
      const items: O[] = [];
      reader.items(depth + 1, (index) => items.push(kind.read(reader, `${path}[${index}]`, depth + 1)));
      return items;
    },
    write(value, out) {
      out.push("[");
      value.forEach((item, index) => {
        if (index > 0) out.push(",");
        kind.write(item, out);
      });
      out.push("]");
    },
  };
}

// ---------------------------------------------------------------- structs and unions

/**
 * A struct schema. With `tag`, the tag field comes first on the wire and is
 * part of the type (`{ action: "health" }`).
 */
export function struct<F extends Fields>(
  name: string,
  fields: F,
  tag?: { readonly field: string; readonly value: string },
  options: { readonly omitDefaults?: boolean } = {},
): Struct<F> {
  const names = Object.keys(fields);
  // As msgspec's `omit_defaults=True`: a field left out, or equal to its default
  // (null, or a scalar default), is not written at all.
  const omitted = (field: AnyKind, item: unknown): boolean =>
    options.omitDefaults === true &&
    field.hasDefault &&
    (item === undefined || item === field.fallback());
  return {
    name,
    label: name,
    fields,
    tag,
    hasDefault: false,
    fallback: () => {
      throw new Error(`${name} has no default`);
    },
    read(reader, path, depth) {
      if (reader.peek() !== 0x7b) mismatch("object", reader, path);
      const got: Record<string, unknown> = {};
      reader.entries(depth + 1, (key) => {
        const field = Object.hasOwn(fields, key) ? fields[key] : undefined;
        if (field === undefined) {
          throw new JsonError(`Object contains unknown field \`${key}\` - at \`${path}\``);
        }
        got[key] = field.read(reader, `${path}.${key}`, depth + 1);
      });
      const value: Record<string, unknown> = {};
      for (const key of names) {
        const field = fields[key] as AnyKind;
        if (Object.hasOwn(got, key)) {
          value[key] = got[key];
        } else if (field.hasDefault) {
          value[key] = field.fallback();
        } else {
          throw new JsonError(`Object missing required field \`${key}\` - at \`${path}\``);
        }
      }
      return value as StructOut<F>;
    },
    write(value, out) {
      const record = value as Record<string, unknown>;
      out.push("{");
      let written = 0;
      names.forEach((key) => {
        const field = fields[key] as AnyKind;
        const item = record[key];
        if (omitted(field, item)) return;
        out.push(written++ === 0 ? "" : ",", JSON.stringify(key), ":");
        if (item === undefined) {
          if (!field.hasDefault) throw new TypeError(`${name}.${key} is required`);
          field.write(field.fallback(), out);
        } else {
          field.write(item, out);
        }
      });
      out.push("}");
    },
  };
}

/** A tagged union of structs: the `field` of the object selects the member. */
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export function union<const M extends readonly Struct<any>[]>(
  field: string,
  members: M,
): Kind<OutOf<M[number]>, InOf<M[number]>, false> & { readonly members: M } {
  const byTag = new Map<string, M[number]>();
  for (const member of members) {
    if (member.tag?.field !== field) throw new Error(`${member.name} is not tagged by ${field}`);
    byTag.set(member.tag.value, member);
  }
  const label = members.map((m) => m.name).join(" | ");
  return {
    label,
    members,
    hasDefault: false,
    fallback: () => {
      throw new Error(`${label} has no default`);
    },
    read(reader, path, depth) {
      if (reader.peek() !== 0x7b) mismatch("object", reader, path);
      const start = reader.pos;
      const tag = findTag(reader, field, path, depth);
      const member = byTag.get(tag);
      if (member === undefined) {
        throw new JsonError(`Invalid value ${JSON.stringify(tag)} - at \`${path}.${field}\``);
      }
      reader.pos = start;
      return member.read(reader, path, depth) as OutOf<M[number]>;
    },
    write(value, out) {
      const tag = (value as Record<string, unknown>)[field];
      const member = typeof tag === "string" ? byTag.get(tag) : undefined;
      if (member === undefined) throw new TypeError(`unknown ${field} ${JSON.stringify(tag)}`);
      member.write(value, out);
    },
  };
}

/** The string value of `field` in the object at the cursor (which is left moved). */
function findTag(reader: JsonReader, field: string, path: string, depth: number): string {
  let tag: string | undefined;
  const found = new Error("found");
  try {
    reader.entries(depth + 1, (key) => {
      if (key !== field) {
        reader.value(depth + 1);
        return;
      }
      if (reader.peek() !== 0x22) mismatch("str", reader, `${path}.${field}`);
      tag = reader.string();
      throw found;
    });
  } catch (err) {
    if (err !== found) throw err;
  }
  if (tag === undefined) throw new JsonError(`Object missing required field \`${field}\` - at \`${path}\``);
  return tag;
}

// ---------------------------------------------------------------- whole messages

/** Read a whole JSON text as `kind`, strictly. */
export function readAs<O>(kind: Kind<O, unknown>, text: string): O {
  const reader = new JsonReader(text);
  const value = kind.read(reader, "$", 0);
  reader.end();
  return value;
}

/** Write `value` as `kind`'s compact text. */
export function writeAs<I>(kind: Kind<unknown, I>, value: I): string {
  const out: string[] = [];
  kind.write(value, out);
  return out.join("");
}

/** A kind's value read from an already decoded JSON value (e.g. a recorded step's result). */
export function convert<O>(kind: Kind<O, unknown>, value: Json): O {
  const out: string[] = [];
  write(value, out);
  return readAs(kind, out.join(""));
}

export { kindOf };
