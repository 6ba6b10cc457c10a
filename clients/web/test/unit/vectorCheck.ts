/**
 * The golden-vector checks, written against an SDK module object so the same checks run on the SDK and on a
 * mutant of it (test/unit/mutant.test.ts). Each returns the list of steps whose bytes differ.
 */
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const VECTORS_DIR = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..", "..", "schemas", "vectors");

// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Sdk = any;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type Vector = any;

export function loadVectors(): Vector[] {
  return readdirSync(VECTORS_DIR).filter((f) => f.endsWith(".json")).sort()
    .map((f) => JSON.parse(readFileSync(join(VECTORS_DIR, f), "utf8")));
}

/** Every wire step of every event, each from the vector's own inputs; returns "case/event/step" of each mismatch. */
export function stepMismatches(sdk: Sdk, v: Vector): string[] {
  const bad: string[] = [];
  const hex = sdk.toHex as (b: Uint8Array) => string;
  const spec = sdk.loadSpec(v.spec);
  const analyzer = sdk.fromHex(v.keys.analyzer_public);
  const shuffler = sdk.fromHex(v.keys.shuffler_public);
  const backstops = new Map<number, number[]>(); // memoizing mechanisms: a value's backstop is drawn once
  v.events.forEach((e: Vector, k: number) => {
    const at = (step: string) => `${v.case}/${k}/${step}`;
    const rng = new sdk.ReplayRandomness(e.draws);
    const index = sdk.domainIndex(spec, e.input.value);
    let messages;
    if (spec.budget.memoizing) {
      if (!backstops.has(index)) backstops.set(index, sdk.backstopBits(spec.mechanism, index, rng));
      messages = sdk.fragmentsFromBackstop(spec.mechanism, backstops.get(index), rng);
    } else {
      messages = sdk.randomize(spec, index, rng);
    }
    if (messages.length !== e.messages.length) bad.push(at("randomize: message count"));
    const byteDraws = e.draws.filter((d: Vector) => d.op === "bytes");
    const ephemerals = byteDraws.slice(0, e.messages.length).map((d: Vector) => sdk.fromHex(d.hex));
    e.messages.forEach((m: Vector, i: number) => {
      const mine = messages[i];
      if (!mine || mine.channel !== m.channel) bad.push(at(`randomize: channel ${i}`));
      if (mine && hex(sdk.encodePayload(spec.wire, mine.payload)) !== m.plaintext) bad.push(at(`payload ${i}`));
      const ad = sdk.associatedData(v.spec.spec_id, e.input.crowd_id ?? null, e.window_end_ms, m.channel);
      if (hex(ad) !== m.associated_data) bad.push(at(`associated data ${i}`));
      const sealed = sdk.seal(analyzer, v.keys.analyzer_key_id, sdk.fromHex(m.plaintext), sdk.fromHex(m.associated_data), ephemerals[i]);
      if (hex(sealed) !== m.sealed) bad.push(at(`seal ${i}`));
    });
    const ms = { specId: v.spec.spec_id, crowdId: e.input.crowd_id ?? null, deviceId: v.keys.device_id,
      eventTimeMs: e.input.event_time_ms, nonce: sdk.fromHex(e.nonce), keyId: v.keys.analyzer_key_id,
      messages: e.messages.map((m: Vector) => ({ channel: m.channel, sealed: sdk.fromHex(m.sealed) })) };
    if (hex(sdk.signingBytes(ms)) !== e.signing_bytes) bad.push(at("signing bytes"));
    const signature = sdk.signMessageSet(ms, sdk.fromHex(v.keys.device_seed));
    if (hex(signature) !== e.signature) bad.push(at("signature"));
    const encoded = sdk.encodeMessageSet({ ...ms, signature }, v.spec.wire.message_set_header);
    if (hex(encoded) !== e.message_set) bad.push(at("message set"));
    const envelope = sdk.sealEnvelope(shuffler, v.keys.shuffler_key_id, sdk.fromHex(e.message_set), sdk.fromHex(byteDraws[byteDraws.length - 1].hex));
    if (hex(envelope) !== e.envelope) bad.push(at("envelope"));
  });
  return bad;
}

/** The whole client, event after event on one device: output bytes, the budget ledger, and every draw consumed. */
export async function clientMismatches(sdk: Sdk, v: Vector): Promise<string[]> {
  const bad: string[] = [];
  const rng = new sdk.ReplayRandomness(v.events.flatMap((e: Vector) => e.draws));
  const storage = new sdk.MemoryStorage();
  const client = await sdk.Client.create({
    spec: v.spec, storage, rng, clock: () => v.budget.now, deviceSeed: sdk.fromHex(v.keys.device_seed),
    budget: { epsilonPerEpoch: v.budget.epsilon_per_epoch, epochSeconds: v.budget.epoch_seconds },
    keys: { analyzerKeyId: v.keys.analyzer_key_id, analyzerPublicKey: sdk.fromHex(v.keys.analyzer_public),
      shufflerKeyId: v.keys.shuffler_key_id, shufflerPublicKey: sdk.fromHex(v.keys.shuffler_public) },
  });
  if (client.deviceId !== v.keys.device_id) bad.push(`${v.case}/device id`);
  for (const [k, e] of v.events.entries()) {
    const out = await client.encode(e.input.value, { eventTimeMs: e.input.event_time_ms, crowdId: e.input.crowd_id ?? null });
    if (sdk.toHex(out) !== e.envelope) bad.push(`${v.case}/${k}/client output`);
    const ledger = JSON.parse(await storage.get("budget.json"));
    if (JSON.stringify(ledger, Object.keys(ledger).sort()) !== JSON.stringify(e.ledger, Object.keys(e.ledger).sort())) {
      bad.push(`${v.case}/${k}/ledger`);
    }
    for (const [file, store] of Object.entries(e.memo as Record<string, Vector>)) {
      const mine = await storage.get(`memo/${file}`);
      if (mine === null || JSON.stringify(JSON.parse(mine).backstops) !== JSON.stringify(store.backstops)
          || JSON.parse(mine).identity !== store.identity) bad.push(`${v.case}/${k}/memo`);
    }
  }
  if (!rng.exhausted) bad.push(`${v.case}/draws left over`);
  return bad;
}
