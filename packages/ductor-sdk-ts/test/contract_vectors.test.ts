/**
 * The SDK held to the golden protocol vectors in tests/contract/vectors/, the
 * same files the Python SDK and the server are tested with. Nothing
 * regenerates them: if the code disagrees with a vector, this test fails.
 */

import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  type Context,
  Ductor,
  type Json,
  NonRetriableError,
  StepFailedError,
} from "../src/index.js";
import * as protocol from "../src/protocol.js";
import {
  ErrorResponse,
  type Kind,
  OPCODE_NAMES,
  REPLAY_WINDOW_SECONDS,
  SCHEMAS,
  SIGNATURE_HEADER,
  SigningKeys,
  StepKeys,
  type StepRecord,
  decode,
  decodeRequest,
  encode,
  encodeText,
  signatureHeader,
  stepId,
  verifySignature,
  verifySigned,
} from "../src/protocol.js";
import { ProtocolError, SignatureError } from "../src/errors.js";
import { load } from "./vectors.js";


interface Envelope {
  name: string;
  type: keyof typeof SCHEMAS;
  class: string;
  wire: string;
}

const bytes = (text: string): Uint8Array => new TextEncoder().encode(text);
const schema = (type: keyof typeof SCHEMAS): Kind<unknown, unknown> => SCHEMAS[type];

function memberName(type: string, value: unknown): string {
  if (type === "BridgeRequest" || type === "Opcode") {
    const record = value as { action?: string; op?: string };
    const union = SCHEMAS[type];
    const tag = type === "BridgeRequest" ? record.action : record.op;
    const member = union.members.find((m) => m.tag?.value === tag);
    return member?.name ?? "?";
  }
  return schema(type as keyof typeof SCHEMAS).label;
}

describe("envelopes round-trip byte for byte", () => {
  for (const group of ["requests", "opcodes", "responses", "server"]) {
    for (const vector of load<{ vectors: Envelope[] }>(group).vectors) {
      test(`${group}:${vector.name}`, () => {
        const value = decode(schema(vector.type), bytes(vector.wire));
        assert.equal(memberName(vector.type, value), vector.class);
        assert.deepEqual(encode(schema(vector.type), value), bytes(vector.wire));
        assert.equal(encodeText(schema(vector.type), value), vector.wire);
      });
    }
  }
});

test("every opcode and action has a vector", () => {
  const opcodes = new Set(load<{ vectors: Envelope[] }>("opcodes").vectors.map((v) => (JSON.parse(v.wire) as { op: string }).op));
  assert.deepEqual([...opcodes].sort(), [...OPCODE_NAMES].sort());
  const actions = new Set(
    load<{ vectors: Envelope[] }>("requests").vectors.map((v) => (JSON.parse(v.wire) as { action: string }).action),
  );
  assert.deepEqual([...actions].sort(), ["cancel", "describe", "execute", "health", "sync"]);
});

test("requests decode through the bridge decoder", () => {
  for (const vector of load<{ vectors: Envelope[] }>("requests").vectors) {
    assert.equal(memberName("BridgeRequest", decodeRequest(bytes(vector.wire))), vector.class);
  }
});

describe("invalid bodies are rejected", () => {
  for (const vector of load<{ vectors: Envelope[] }>("invalid").vectors) {
    test(vector.name, () => {
      const wire = bytes(vector.wire);
      const check = vector.type === "BridgeRequest" ? () => decodeRequest(wire) : () => decode(schema(vector.type), wire);
      assert.throws(check, (err: unknown) => err instanceof ProtocolError && err.code === "protocol.invalid");
    });
  }
});

test("a body that is no JSON value is malformed JSON, not a value of the wrong type (msgspec's words)", () => {
  const refusal = (wire: string): string => {
    try {
      decodeRequest(bytes(wire));
    } catch (err) {
      assert.ok(err instanceof ProtocolError && err.code === "protocol.invalid");
      return err.message;
    }
    return assert.fail(`${wire} was accepted`);
  };
  for (const wire of ["not json", "nul", "tru", "01", "+1", "", '{"action":nul}', '{"action":"execute","run_id":"r","workflow_id":"w","attempt":nope}']) {
    assert.match(refusal(wire), /^invalid bridge request: JSON is malformed: /, wire);
  }
  assert.equal(refusal("null"), "invalid bridge request: Expected `object`, got `null` - at `$`");
  assert.equal(refusal('{"action":null}'), "invalid bridge request: Expected `str`, got `null` - at `$.action`");
  assert.equal(refusal('{"action":true}'), "invalid bridge request: Expected `str`, got `bool` - at `$.action`");
});

interface SignVector {
  name: string;
  keys: string[];
  timestamp: number;
  nonce?: string;
  body: string;
  header: string;
}
interface VerifyVector {
  name: string;
  key: string;
  fallback_key: string | null;
  keys: string[];
  require_nonce: boolean;
  now: number;
  body: string;
  header: string | null;
  expect: string;
  nonce?: string | null;
}
interface Signatures {
  window_seconds: number;
  sign: SignVector[];
  verify: VerifyVector[];
  sign_nonce: SignVector[];
  verify_nonce: VerifyVector[];
  replay: { key: string; steps: { now: number; body: string; header: string; expect: string }[] };
}
const SIGNATURES = load<Signatures>("signatures");

function expectCode(check: () => unknown, code: string): void {
  assert.throws(check, (err: unknown) => err instanceof SignatureError && err.code === code);
}

describe("signing gives the vector header", () => {
  for (const vector of SIGNATURES.sign) {
    test(vector.name, () => {
      assert.equal(signatureHeader(bytes(vector.body), vector.keys, vector.timestamp), vector.header);
      assert.equal(signatureHeader(vector.body, vector.keys, vector.timestamp), vector.header);
    });
  }
});

describe("verification accepts or rejects as the vector says", () => {
  for (const vector of SIGNATURES.verify) {
    test(vector.name, () => {
      const check = () =>
        verifySignature(bytes(vector.body), vector.header, {
          key: vector.key,
          fallbackKey: vector.fallback_key,
          now: vector.now,
          window: SIGNATURES.window_seconds,
        });
      if (vector.expect === "ok") {
        assert.equal(check(), Number((vector.header ?? "").split(",")[0]?.replace("t=", "")));
      } else {
        expectCode(check, vector.expect);
      }
    });
  }
});

describe("signing with a nonce gives the vector header", () => {
  for (const vector of SIGNATURES.sign_nonce) {
    test(vector.name, () => {
      const header = signatureHeader(bytes(vector.body), vector.keys, vector.timestamp, { nonce: vector.nonce });
      assert.equal(header, vector.header);
      const [only] = vector.keys;
      if (vector.keys.length === 1 && only !== undefined) {
        assert.equal(new SigningKeys(only).header(bytes(vector.body), vector.timestamp, vector.nonce), header);
      }
    });
  }
});

describe("nonce verification accepts or rejects as the vector says", () => {
  for (const vector of SIGNATURES.verify_nonce) {
    test(vector.name, () => {
      const check = () =>
        verifySigned(bytes(vector.body), vector.header, {
          keys: vector.keys,
          now: vector.now,
          window: SIGNATURES.window_seconds,
          requireNonce: vector.require_nonce,
        });
      if (vector.expect === "ok") {
        const verified = check();
        assert.equal(verified.nonce, vector.nonce);
        assert.equal(verified.timestamp, Number((vector.header ?? "").split(",")[0]?.replace("t=", "")));
      } else {
        expectCode(check, vector.expect);
      }
    });
  }
});

test("a receiver accepts each nonce once as the vector says", async () => {
  const { replay } = SIGNATURES;
  let now = 0;
  const ductor = new Ductor({ appId: "contract", signingKey: replay.key, clock: () => now });
  for (const step of replay.steps) {
    now = step.now;
    const answer = await ductor.handle({
      method: "POST",
      headers: { [SIGNATURE_HEADER]: step.header },
      body: bytes(step.body),
    });
    if (step.expect === "ok") {
      assert.equal(answer.status, 200, new TextDecoder().decode(answer.body));
    } else {
      assert.equal(answer.status, 401);
      assert.equal(decode(ErrorResponse, answer.body).code, step.expect);
    }
  }
});

test("the window matches the protocol constant", () => {
  assert.equal(SIGNATURES.window_seconds, REPLAY_WINDOW_SECONDS);
});

test("step ids and repeat numbering", () => {
  for (const sequence of load<{ sequences: { names: string[]; keys: string[]; ids: string[] }[] }>("step_ids")
    .sequences) {
    const keys = new StepKeys();
    const got = sequence.names.map((name) => keys.key(name));
    assert.deepEqual(got, sequence.keys);
    assert.deepEqual(
      got.map((key) => stepId(key)),
      sequence.ids,
    );
  }
});

// ---------------------------------------------------------------- replay scenarios

type Program = [string, ...Json[]][];
interface Scenario {
  name: string;
  program: Program;
  history: StepRecord[];
  attempt?: number;
  target_step?: string;
  expect: Json[];
}

/** The workflow 'scenario' built from a replay vector's program (see replay.json). */
function scenarioApp(program: Program): Ductor {
  const ductor = new Ductor({ appId: "contract", signingKey: "contract-key" });
  ductor.workflow({ id: "scenario", retries: 2 }, async (ctx: Context, _input: Json) => {
    const out: Json[] = [];
    for (const op of program) {
      const [kind, ...args] = op;
      if (kind === "run") {
        const [name, value] = args as [string, Json];
        out.push(await ctx.step.run(name, () => value));
      } else if (kind === "sleep") {
        const [name, duration] = args as [string, string];
        await ctx.step.sleep(name, duration as `${number}s`);
        out.push(null);
      } else if (kind === "event") {
        const [name, event, timeout] = args as [string, string, string];
        const got = await ctx.step.waitForEvent(name, { event, timeout: timeout as `${number}d` });
        out.push(got === null ? null : got.data);
      } else if (kind === "signal") {
        const [name, timeout] = args as [string, string];
        const got = await ctx.step.waitForSignal(name, { timeout: timeout as `${number}d` });
        out.push(got === null ? null : got.data);
      } else if (kind === "invoke") {
        const [name, workflow, input] = args as [string, string, Json];
        out.push(await ctx.step.invoke(name, { workflow, input }));
      } else if (kind === "fail") {
        const [name, code] = args as [string, string];
        try {
          await ctx.step.run(name, () => {
            throw new NonRetriableError("declined", { code });
          });
        } catch (err) {
          if (!(err instanceof StepFailedError)) throw err;
          out.push(`failed:${err.code}`);
        }
      } else if (kind === "gather") {
        const [pairs] = args as [[string, Json][]];
        out.push(await Promise.all(pairs.map(([name, value]) => ctx.step.run(name, () => value))));
      } else {
        throw new Error(`unknown program op ${kind}`);
      }
    }
    return out;
  });
  return ductor;
}

/** Drop the SDK's own words (error message and exception name) before comparing. */
function comparable(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(comparable);
  if (value !== null && typeof value === "object") {
    const record = value as Record<string, unknown>;
    const isError = "code" in record && "retryable" in record;
    return Object.fromEntries(
      Object.entries(record)
        .filter(([key]) => !(isError && (key === "message" || key === "name")))
        .map(([key, item]) => [key, comparable(item)]),
    );
  }
  return value;
}

describe("replay scenarios", () => {
  for (const scenario of load<{ scenarios: Scenario[] }>("replay").scenarios) {
    test(scenario.name, async () => {
      const ductor = scenarioApp(scenario.program);
      const history = decode(
        protocol.ExecuteRequest,
        JSON.stringify({ action: "execute", run_id: "run-1", workflow_id: "scenario", steps: scenario.history }),
      ).steps;
      const response = await ductor.execute({
        action: "execute",
        run_id: "run-1",
        workflow_id: "scenario",
        attempt: scenario.attempt ?? 0,
        input: null,
        steps: history,
        event: null,
        target_step: scenario.target_step ?? null,
        payload_ref: null,
        traceparent: null,
      });
      const got = response.opcodes.map((op) => JSON.parse(encodeText(protocol.Opcode, op)) as unknown);
      assert.deepEqual(comparable(got), comparable(scenario.expect));
    });
  }
});
