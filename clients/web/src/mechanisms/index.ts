/**
 * The randomizers, one client at a time, drawing exactly what their Python twins draw for a batch of one
 * (`transforms/mechanisms/frequency/oracles.py`, `olh.py`, `transforms/mechanisms/ranges/channel_oracles.py`,
 * `dyadic.py`), in the same order and shapes, so golden vectors replay Python's coins.
 */
import type { DyadicSpec, ExportedSpec, MechanismSpec, OracleSpec } from "../spec.js";
import type { Randomness } from "../random.js";
import { backstopBits, fragmentsFromBackstop } from "./fragments.js";
import { hashToBucket, linearHash } from "./hashing.js";

export type Payload =
  | { kind: "category"; value: number }
  | { kind: "bits"; bits: Uint8Array }
  | { kind: "hashed"; seed: bigint; z: number }
  | { kind: "mark" };

/** One message of a report: its channel (PRESENCE for the marker of multi-message mechanisms) and payload. */
export interface Message {
  channel: number;
  payload: Payload;
}

export const PRESENCE = -1;

/** GRR's replacement: a uniform draw over the d - 1 other values, `r + (r >= v)`. */
function grrOutput(keep: boolean, v: number, r: number): number {
  return keep ? v : r + (r >= v ? 1 : 0);
}

/** numpy.packbits order: bit j of the vector is bit 7 - j % 8 of byte j / 8. */
export function packBits(bits: boolean[], width: number): Uint8Array {
  const out = new Uint8Array(Math.ceil(width / 8));
  for (let j = 0; j < width; j++) if (bits[j]) out[j >> 3] |= 0x80 >> (j & 7);
  return out;
}

export function grr(m: OracleSpec, v: number, rng: Randomness): Payload {
  const keep = rng.random([1])[0] < m.p;
  const r = rng.integers(0, m.d - 1, [1])[0];
  return { kind: "category", value: grrOutput(keep, v, r) };
}

export function oue(m: OracleSpec, v: number, rng: Randomness): Payload {
  const u = rng.random([1, m.d]);
  const q = m.q as number;
  const bits = u.map((x, j) => (j === v ? x < m.p : x < q));
  return { kind: "bits", bits: packBits(bits, m.d) };
}

export function olh(m: OracleSpec, v: number, rng: Randomness): Payload {
  const seed = rng.integers(0, m.seed_family as number, [1])[0];
  const keep = rng.random([1])[0] < m.p;
  const r = rng.integers(0, (m.g as number) - 1, [1])[0];
  const h = hashToBucket(seed, v, m.g as number);
  return { kind: "hashed", seed: BigInt(seed), z: grrOutput(keep, h, r) };
}

/** One level's message of a dyadic tree (`ChannelOracles.encode` for a batch of one). */
function levelMessage(m: DyadicSpec, level: number, v: number, rng: Randomness): Payload {
  const oracle = m.level_oracles[level];
  const bits = m.prefix_lengths[level];
  if (m.oracle === "oue") {
    const u = rng.random([1, m.oue_width]);
    const q = oracle.q as number;
    const out = u.map((x, j) => (j === v ? x < oracle.p : x < q && j < 1 << bits));
    return { kind: "bits", bits: packBits(out, m.oue_width) };
  }
  if (m.oracle === "grr") {
    const keep = rng.random([1])[0] < oracle.p;
    const r = rng.integers(0, [2 ** bits - 1], [1])[0];
    return { kind: "category", value: grrOutput(keep, v, r) };
  }
  const g = oracle.g as number;
  if (m.oracle === "olh") {
    const seed = rng.integers(0, m.seed_family, [1])[0];
    const keep = rng.random([1])[0] < oracle.p;
    const r = rng.integers(0, g - 1, [1])[0];
    return { kind: "hashed", seed: BigInt(seed), z: grrOutput(keep, hashToBucket(seed, v, g), r) };
  }
  const w = rng.integers(0, 2 ** 32, [1, 2]);
  const seed = (BigInt(w[0] & 0x7fffffff) << 32n) | BigInt(w[1]);
  const keep = rng.random([1])[0] < oracle.p;
  const r = rng.integers(0, g - 1, [1])[0];
  const k = Math.log2(g);
  return { kind: "hashed", seed, z: grrOutput(keep, linearHash(seed, v, k), r) };
}

export function dyadic(m: DyadicSpec, x: number, rng: Randomness): Message[] {
  const out: Message[] = [{ channel: PRESENCE, payload: { kind: "mark" } }];
  if (m.levels === "sample") {
    const level = rng.integers(0, m.channels, [1])[0];
    const prefix = Math.floor(x / 2 ** (m.bits - m.prefix_lengths[level]));
    out.push({ channel: level, payload: levelMessage(m, level, prefix, rng) });
    return out;
  }
  m.prefix_lengths.forEach((length, level) => {
    const prefix = Math.floor(x / 2 ** (m.bits - length));
    out.push({ channel: level, payload: levelMessage(m, level, prefix, rng) });
  });
  return out;
}

/** The messages of one report of index `v` (category or leaf): presence marker first where there is one. */
export function randomize(spec: ExportedSpec, v: number, rng: Randomness): Message[] {
  const m: MechanismSpec = spec.mechanism;
  switch (m.name) {
    case "grr":
      return [{ channel: 0, payload: grr(m, v, rng) }];
    case "oue":
      return [{ channel: 0, payload: oue(m, v, rng) }];
    case "olh":
      return [{ channel: 0, payload: olh(m, v, rng) }];
    case "dyadic_range":
      return dyadic(m, v, rng);
    case "rappor_fragments": // one window's fresh draw, backstop not kept: the Client memoizes it instead
      return fragmentsFromBackstop(m, backstopBits(m, v, rng), rng);
    default:
      throw new Error(`mechanism ${(m as MechanismSpec).name} is not implemented by the web SDK`);
  }
}
