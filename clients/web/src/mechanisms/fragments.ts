/**
 * Report fragmenting with a permanent backstop ([ESA] Alg. 2; `ReportFragmentedRappor` in
 * transforms/mechanisms/frequency/unary.py, sampled as `unary_sampling.py` does): per bit of the one-hot vector a
 * backstop RR(eps_b), drawn once per value and memoized on the device, then per report `fragments` fresh views
 * RR(eps_f) of it, each set bit a "mark" message on channel `fragment * d + bit`. One client at a time, with the
 * Python encoder's draws (shapes and order), so the golden vectors replay its coins.
 */
import type { Randomness } from "../random.js";
import { PRESENCE, type Message } from "./index.js";

export interface FragmentsSpec {
  name: "rappor_fragments";
  d: number;
  epsilon_backstop: number;
  epsilon_fragment: number;
  fragments: number;
  channels: number;
  q_backstop: number;
  p_backstop: number;
  q_fragment: number;
  keep_boost: number;
  backstop_cap: number;
  fragment_cap: number;
  log1p_neg_q_backstop: number;
  log1p_neg_q_fragment: number;
}

/** Ascending positions of the first `draws` ones of a Bernoulli(q) sequence of length `slots` (geometric gaps,
 * one uniform each; `bernoulli_positions` for one row), without the padding. */
function bernoulliPositions(rng: Randomness, slots: number, log1pNegQ: number, draws: number): number[] {
  const u = rng.random([1, draws]);
  const out: number[] = [];
  let sum = 0;
  for (const x of u) {
    sum += Math.min(Math.floor(Math.log1p(-x) / log1pNegQ), slots) + 1;
    const position = Math.min(sum - 1, slots);
    if (position < slots) out.push(position);
  }
  return out;
}

function union(a: number[], b: number[]): number[] {
  return [...new Set([...a, ...b])].sort((x, y) => x - y);
}

/** The permanent backstop of value v: its set bits, ascending, at most `backstop_cap`. */
export function backstopBits(m: FragmentsSpec, v: number, rng: Randomness): number[] {
  const own = rng.random([1])[0] < m.p_backstop;
  const others = bernoulliPositions(rng, m.d - 1, m.log1p_neg_q_backstop, Math.min(m.backstop_cap, m.d - 1))
    .map((r) => r + (r >= v ? 1 : 0));
  return union(others, own ? [v] : []).slice(0, m.backstop_cap);
}

/** One report's messages from a stored backstop: the presence marker, then each fragment's set bits. */
export function fragmentsFromBackstop(m: FragmentsSpec, backstop: number[], rng: Randomness): Message[] {
  if (backstop.length > m.backstop_cap || backstop.some((b, i) => !Number.isInteger(b) || b < 0 || b >= m.d || (i > 0 && b <= backstop[i - 1]))) {
    throw new Error("corrupt stored backstop");
  }
  const out: Message[] = [{ channel: PRESENCE, payload: { kind: "mark" } }];
  for (let i = 0; i < m.fragments; i++) {
    const noise = bernoulliPositions(rng, m.d, m.log1p_neg_q_fragment, Math.min(m.fragment_cap, m.d));
    const boost = rng.random([1, m.backstop_cap]);
    const boosted = backstop.filter((_, k) => boost[k] < m.keep_boost);
    for (const bit of union(noise, boosted).slice(0, m.fragment_cap)) out.push({ channel: i * m.d + bit, payload: { kind: "mark" } });
  }
  return out;
}

/** ln((e^(a+b) + 1)/(e^a + e^b)): removal LDP of b-DP post-processing of an a-DP randomizer ([ESA] Thm IV.1),
 * in the two numerically stable forms of transforms/privacy/composition.py. */
export function composePostProcessing(eps1: number, eps2: number): number {
  const a = Math.max(eps1, eps2);
  const b = Math.min(eps1, eps2);
  if (b <= 30.0) return Math.log1p((-Math.expm1(-a) * Math.expm1(b)) / (1.0 + Math.exp(b - a)));
  const logaddexp = (x: number, y: number) => Math.max(x, y) + Math.log1p(Math.exp(Math.min(x, y) - Math.max(x, y)));
  return logaddexp(a + b, 0.0) - logaddexp(a, b);
}

/** What the k-th report of one value in an epoch costs (replacement: two bits): 2 (eps(k tau) - eps((k-1) tau)). */
export function fragmentReportCost(m: FragmentsSpec, k: number): number {
  const eps = (t: number) => (t === 0 ? 0 : composePostProcessing(m.epsilon_backstop, t * m.epsilon_fragment));
  return Math.max(0, 2.0 * (eps(k * m.fragments) - eps((k - 1) * m.fragments)));
}
