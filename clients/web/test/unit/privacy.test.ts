/**
 * Exact privacy and fixed-seed statistics of the JS randomizers, the same cases and thresholds as their Python
 * twins (tests/mechanisms/test_frequency_ldp.py, tests/statistical/test_frequency_stats.py).
 *
 * Exact LDP: the enumerated output law of each randomizer has every ratio <= e^eps (and = e^eps: tight), and
 * 200,000 draws of the real JS randomizer per input follow that law (z < 5 on every outcome). A randomizer that
 * drifted from its law (a wrong threshold, a biased replacement) fails the second check; the first is shown to
 * fail on a broken law. Statistics: unbiased counts whose summed squared error matches the closed-form variance.
 */
import { describe, expect, it } from "vitest";
import { hashToBucket } from "../../src/mechanisms/hashing.js";
import { grr, olh, oue, type Payload } from "../../src/mechanisms/index.js";
import { SeededRandomness } from "../../src/random.js";
import type { OracleSpec } from "../../src/spec.js";
import {
  assertCountsFollowLaw, assertExactLdp, assertMean, assertSummedVariance, rrCountVariance, solve, zipfCounts,
} from "./stats.js";

function grrSpec(d: number, epsilon: number): OracleSpec {
  const e = Math.exp(epsilon);
  return { name: "grr", d, epsilon, p: e / (e + d - 1), q: 1 / (e + d - 1) };
}

function oueSpec(d: number, epsilon: number): OracleSpec {
  return { name: "oue", d, epsilon, p: 0.5, q: 1 / (1 + Math.exp(epsilon)) };
}

function olhSpec(d: number, epsilon: number, g: number | null, seedFamily: number): OracleSpec {
  const buckets = g ?? Math.max(2, Math.round(Math.exp(epsilon) + 1));
  const e = Math.exp(epsilon);
  return { name: "olh", d, epsilon, g: buckets, seed_family: seedFamily, p: e / (e + buckets - 1) };
}

const run = { grr, oue, olh } as const;

/** P(outcome | v) for every outcome, in the Python enumeration order (oracles.py / olh.py). */
function exactLaw(m: OracleSpec, v: number): number[] {
  if (m.name === "grr") return Array.from({ length: m.d }, (_, y) => (y === v ? m.p : (m.q as number)));
  if (m.name === "oue") {
    return Array.from({ length: 2 ** m.d }, (_, k) => {
      let prob = 1;
      for (let j = 0; j < m.d; j++) {
        const one = j === v ? m.p : (m.q as number);
        prob *= (k >> j) & 1 ? one : 1 - one;
      }
      return prob;
    });
  }
  const g = m.g as number;
  const s = m.seed_family as number;
  const qOther = (1 - m.p) / (g - 1);
  const out: number[] = [];
  for (let seed = 0; seed < s; seed++) {
    const h = hashToBucket(seed, v, g);
    for (let z = 0; z < g; z++) out.push((z === h ? m.p : qOther) / s);
  }
  return out;
}

function outcome(m: OracleSpec, p: Payload): number {
  if (p.kind === "category") return p.value;
  if (p.kind === "bits") {
    let k = 0;
    for (let j = 0; j < m.d; j++) if (p.bits[j >> 3] & (0x80 >> (j & 7))) k |= 1 << j;
    return k;
  }
  if (p.kind === "hashed") return Number(p.seed) * (m.g as number) + p.z;
  throw new Error("no outcome");
}

const CASES: OracleSpec[] = [
  ...[2, 3, 5].flatMap((d) => [0.5, 2.0].map((e) => grrSpec(d, e))),
  ...[2, 3, 4].flatMap((d) => [0.5, 2.0].map((e) => oueSpec(d, e))),
  olhSpec(4, 1.0, 3, 8),
  olhSpec(4, 2.0, 3, 8),
];
const EMPIRICAL = [grrSpec(3, 0.5), grrSpec(5, 2.0), oueSpec(3, 0.5), oueSpec(4, 2.0), olhSpec(4, 2.0, 3, 8)];
const label = (m: OracleSpec) => `${m.name}(d=${m.d}, eps=${m.epsilon}${m.g ? `, g=${m.g}, S=${m.seed_family}` : ""})`;

describe("exact LDP (enumerated laws)", () => {
  for (const m of CASES) {
    it(`${label(m)}: every ratio <= e^eps, tight`, () => {
      const table = Array.from({ length: m.d }, (_, v) => exactLaw(m, v));
      const worst = assertExactLdp(table, m.epsilon);
      expect(Math.abs(worst / Math.exp(m.epsilon) - 1)).toBeLessThan(1e-12);
    });
  }

  it("the ratio check fails on a broken law (GRR keeping its value too often)", () => {
    const m = grrSpec(3, 1.0);
    const broken = { ...m, p: m.p + 0.05, q: (1 - m.p - 0.05) / 2 };
    const table = Array.from({ length: 3 }, (_, v) => exactLaw(broken, v));
    expect(() => assertExactLdp(table, m.epsilon)).toThrow();
  });

  for (const m of EMPIRICAL) {
    it(`${label(m)}: 200,000 reports per input follow the enumerated law`, () => {
      const rng = new SeededRandomness(1234);
      const draws = 200_000;
      for (let v = 0; v < m.d; v++) {
        const law = exactLaw(m, v);
        const freq = new Array<number>(law.length).fill(0);
        for (let i = 0; i < draws; i++) freq[outcome(m, run[m.name as "grr" | "oue" | "olh"](m, v, rng))]++;
        assertCountsFollowLaw(freq, law, draws, `${label(m)} input ${v}`);
      }
    });
  }

  it("the law check fails on a drifted randomizer (GRR drawing against p + 0.01)", () => {
    const m = grrSpec(3, 0.5);
    const drifted = { ...m, p: m.p + 0.01 };
    const rng = new SeededRandomness(1234);
    const freq = [0, 0, 0];
    for (let i = 0; i < 200_000; i++) freq[outcome(m, grr(drifted, 0, rng))]++;
    expect(() => assertCountsFollowLaw(freq, exactLaw(m, 0), 200_000, "drifted")).toThrow();
  });
});

/** R x d count estimates of a fixed dataset, each run randomized afresh and decoded. */
function estimates(m: OracleSpec, counts: number[], runs: number, seed: number): number[][] {
  const rng = new SeededRandomness(seed);
  const n = counts.reduce((a, b) => a + b, 0);
  const values = counts.flatMap((c, v) => new Array<number>(c).fill(v));
  const out: number[][] = [];
  let table: Int32Array | null = null;
  let system: number[][] | null = null;
  if (m.name === "olh") {
    const g = m.g as number;
    const s = m.seed_family as number;
    table = new Int32Array(s * m.d);
    for (let seed = 0; seed < s; seed++) for (let v = 0; v < m.d; v++) table[seed * m.d + v] = hashToBucket(seed, v, g);
    const qOther = (1 - m.p) / (g - 1);
    // (p - q') (Pc - J/g) c = C - n/g, Pc[x][v] = fraction of seeds with H_s(x) == H_s(v) (olh.py's exact decoder)
    system = Array.from({ length: m.d }, (_, x) => Array.from({ length: m.d }, (_, v) => {
      let same = 0;
      for (let seed = 0; seed < s; seed++) if (table![seed * m.d + x] === table![seed * m.d + v]) same++;
      return (m.p - qOther) * (same / s - 1 / g);
    }));
  }
  for (let r = 0; r < runs; r++) {
    const support = new Array<number>(m.d).fill(0);
    for (const v of values) {
      const p = run[m.name as "grr" | "oue" | "olh"](m, v, rng);
      if (p.kind === "category") support[p.value]++;
      else if (p.kind === "bits") for (let j = 0; j < m.d; j++) support[j] += p.bits[j >> 3] & (0x80 >> (j & 7)) ? 1 : 0;
      else if (p.kind === "hashed") for (let x = 0; x < m.d; x++) support[x] += table![Number(p.seed) * m.d + x] === p.z ? 1 : 0;
    }
    if (m.name === "olh") out.push(solve(system!, support.map((c) => c - n / (m.g as number))));
    else out.push(support.map((c) => (c - n * (m.q as number)) / (m.p - (m.q as number))));
  }
  return out;
}

function variance(m: OracleSpec, counts: number[], n: number): number[] {
  if (m.name !== "olh") return rrCountVariance(counts, n, m.p, m.q as number);
  const factor = 1 / (1 - m.d / ((m.seed_family as number) * ((m.g as number) - 1)));
  return rrCountVariance(counts, n, m.p, 1 / (m.g as number)).map((x) => x * factor);
}

const STATS: [OracleSpec, number, number][] = [
  [grrSpec(8, 1.0), 3000, 400],
  [grrSpec(16, 2.0), 4000, 400],
  [oueSpec(12, 0.5), 3000, 400],
  [oueSpec(16, 2.0), 3000, 400],
  [olhSpec(16, 1.0, null, 2 ** 14), 3000, 300],
];

describe("fixed-seed statistics: unbiased, with the closed-form variance", () => {
  for (const [m, n, runs] of STATS) {
    it(`${label(m)}, n=${n}, ${runs} runs`, () => {
      const counts = zipfCounts(m.d, n);
      const est = estimates(m, counts, runs, 1000 + m.d + n);
      const v = variance(m, counts, n);
      assertMean(est, counts, v, label(m));
      assertSummedVariance(est, counts, v.reduce((a, b) => a + b, 0), label(m));
    });
  }

  it("the variance check sees a closed form that is 25% off", () => {
    const m = grrSpec(8, 1.0);
    const counts = zipfCounts(8, 3000);
    const est = estimates(m, counts, 400, 1011);
    const v = variance(m, counts, 3000).reduce((a, b) => a + b, 0);
    expect(() => assertSummedVariance(est, counts, 1.25 * v, "wrong closed form")).toThrow();
  });
});
