/**
 * rappor_fragments in JS: the permanent backstop and each fragment follow their laws (fixed seed, binomial
 * z-scores below 5, as tests/mechanisms/ldp_helpers.py), one fragment bit is exactly eps(1)-LDP ([ESA] Thm IV.1,
 * removal), and the law check fails on a broken boost. The device's memoization is in the golden vectors.
 */
import { describe, expect, it } from "vitest";
import { backstopBits, composePostProcessing, type FragmentsSpec, fragmentsFromBackstop } from "../../src/mechanisms/fragments.js";
import { SeededRandomness } from "../../src/random.js";
import { assertCountsFollowLaw } from "./stats.js";
import { loadVectors } from "./vectorCheck.js";

const m = loadVectors().find((v) => v.case === "rappor_fragments")!.spec.mechanism as FragmentsSpec;
const DRAWS = 200_000;

/** Per-bit frequencies as a two-outcome law each: z-test every bit's count of ones. */
function assertBits(ones: number[], probs: number[], label: string, draws = DRAWS): void {
  ones.forEach((k, j) => assertCountsFollowLaw([draws - k, k], [1 - probs[j], probs[j]], draws, `${label} bit ${j}`));
}

describe("rappor_fragments", () => {
  it("the backstop is RR(eps_b) on every bit of the one-hot vector", () => {
    const rng = new SeededRandomness(31);
    const ones = new Array<number>(m.d).fill(0);
    for (let i = 0; i < DRAWS; i++) for (const b of backstopBits(m, 2, rng)) ones[b]++;
    assertBits(ones, ones.map((_, j) => (j === 2 ? m.p_backstop : m.q_backstop)), "backstop");
  });

  const fragmentLaw = (backstop: number[], boost: number) => Array.from({ length: m.d }, (_, j) =>
    backstop.includes(j) ? m.q_fragment + (1 - m.q_fragment) * boost : m.q_fragment);

  it("each fragment reports a set backstop bit w.p. p_f and any other w.p. q_f", () => {
    const rng = new SeededRandomness(32);
    const draws = 50_000; // the broken boost below moves p_f by 0.028, some 20 standard errors at this size
    const backstop = [2, 5];
    const ones = Array.from({ length: m.fragments }, () => new Array<number>(m.d).fill(0));
    for (let i = 0; i < draws; i++) {
      const messages = fragmentsFromBackstop(m, backstop, rng);
      expect(messages[0].channel).toBe(-1);
      for (const msg of messages.slice(1)) ones[Math.floor(msg.channel / m.d)][msg.channel % m.d]++;
    }
    ones.forEach((row, f) => assertBits(row, fragmentLaw(backstop, m.keep_boost), `fragment ${f}`, draws));
    const broken = { ...m, keep_boost: m.keep_boost * 0.97 };
    const drifted = new Array<number>(m.d).fill(0);
    for (let i = 0; i < draws; i++) {
      for (const msg of fragmentsFromBackstop(broken, backstop, rng)) if (msg.channel >= 0 && msg.channel < m.d) drifted[msg.channel]++;
    }
    expect(() => assertBits(drifted, fragmentLaw(backstop, m.keep_boost), "broken boost", draws)).toThrow();
  });

  it("one fragment bit is exactly eps(1)-LDP (removal), eps(1) < eps_b", () => {
    const pF = m.q_fragment + (1 - m.q_fragment) * m.keep_boost;
    const one = m.p_backstop * pF + (1 - m.p_backstop) * m.q_fragment; // P(y = 1 | x = 1)
    const zero = m.q_backstop * pF + (1 - m.q_backstop) * m.q_fragment; // P(y = 1 | x = 0)
    const worst = Math.max(one / zero, (1 - zero) / (1 - one));
    const eps1 = composePostProcessing(m.epsilon_backstop, m.epsilon_fragment);
    expect(Math.abs(Math.log(worst) / eps1 - 1)).toBeLessThan(1e-9);
    expect(eps1).toBeLessThan(m.epsilon_backstop);
  });
});
