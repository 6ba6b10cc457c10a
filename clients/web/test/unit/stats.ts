/**
 * The Python suite's statistical and exact-LDP checks (tests/statistical/stats_helpers.py,
 * tests/mechanisms/ldp_helpers.py), restated for the JS randomizers with the same thresholds.
 */
import { expect } from "vitest";

export const Z_MAX = 4.5; // Bonferroni over <= 16 coordinates: P(max |z| > 4.5) < 16 * 6.8e-6
export const SE_MAX = 4.0;
export const Z_LAW = 5.0; // Bonferroni over a few hundred outcomes: P(max |z| > 5) < 300 * 5.7e-7

/** Deterministic Zipf-like true counts summing to n (every item present, heavy head). */
export function zipfCounts(d: number, n: number, s = 1.1): number[] {
  const w = Array.from({ length: d }, (_, i) => 1 / (i + 1) ** s);
  const total = w.reduce((a, b) => a + b, 0);
  const c = w.map((x) => Math.floor((n * x) / total));
  c[0] += n - c.reduce((a, b) => a + b, 0);
  return c;
}

/** Variance of `(C - n q)/(p - q)` where a holder counts w.p. p and anyone else w.p. q, independently. */
export function rrCountVariance(counts: number[], n: number, p: number, q: number): number[] {
  return counts.map((c) => (c * p * (1 - p) + (n - c) * q * (1 - q)) / (p - q) ** 2);
}

/** Every coordinate's run mean within Z_MAX standard errors of the truth. */
export function assertMean(est: number[][], centre: number[], variance: number[], label: string): void {
  const runs = est.length;
  const z = centre.map((c, v) => (est.reduce((a, r) => a + r[v], 0) / runs - c) / Math.sqrt(variance[v] / runs));
  const worst = Math.max(...z.map(Math.abs));
  expect(worst, `${label}: max |z| = ${worst.toFixed(2)}`).toBeLessThan(Z_MAX);
}

/** Mean of ||est_r - c||^2 within SE_MAX CLT standard errors of the summed closed-form variance, the standard
 * error itself below `sharpness` of it (so a closed form wrong by ~20 % would be seen). */
export function assertSummedVariance(est: number[][], centre: number[], expected: number, label: string, sharpness = 0.05): void {
  const t = est.map((r) => r.reduce((a, x, v) => a + (x - centre[v]) ** 2, 0));
  const mean = t.reduce((a, b) => a + b, 0) / t.length;
  const sd = Math.sqrt(t.reduce((a, x) => a + (x - mean) ** 2, 0) / (t.length - 1));
  const se = sd / Math.sqrt(t.length);
  expect(Math.abs(mean - expected), `${label}: summed variance ${mean} vs closed form ${expected} (se ${se})`).toBeLessThan(SE_MAX * se);
  expect(se, `${label}: se too large to test the closed form`).toBeLessThan(sharpness * expected);
}

/** Rows are exact output laws: distributions with full support and every ratio at most e^eps. Returns the worst. */
export function assertExactLdp(table: number[][], epsilon: number): number {
  for (const row of table) {
    expect(Math.abs(row.reduce((a, b) => a + b, 0) - 1)).toBeLessThan(1e-12);
    expect(Math.min(...row)).toBeGreaterThan(0);
  }
  let worst = 0;
  for (let y = 0; y < table[0].length; y++) {
    const column = table.map((r) => r[y]);
    worst = Math.max(worst, Math.max(...column) / Math.min(...column));
  }
  expect(worst).toBeLessThanOrEqual(Math.exp(epsilon) * (1 + 1e-12));
  return worst;
}

/** Outcome counts of `draws` i.i.d. reports follow `law` (binomial z-scores below Z_LAW, nothing off the support). */
export function assertCountsFollowLaw(freq: number[], law: number[], draws: number, label: string): void {
  expect(freq.length).toBe(law.length);
  let worst = 0;
  law.forEach((p, y) => {
    if (p === 0) {
      expect(freq[y], `${label}: report outside the support`).toBe(0);
      return;
    }
    const e = draws * p;
    worst = Math.max(worst, Math.abs((freq[y] - e) / Math.sqrt(e * (1 - p))));
  });
  expect(worst, `${label}: max |z| = ${worst.toFixed(2)}`).toBeLessThan(Z_LAW);
}

/** Solve A x = b (Gaussian elimination with partial pivoting; small dense systems only). */
export function solve(a: number[][], b: number[]): number[] {
  const n = b.length;
  const m = a.map((row, i) => [...row, b[i]]);
  for (let c = 0; c < n; c++) {
    let pivot = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(m[r][c]) > Math.abs(m[pivot][c])) pivot = r;
    [m[c], m[pivot]] = [m[pivot], m[c]];
    for (let r = 0; r < n; r++) {
      if (r === c) continue;
      const f = m[r][c] / m[c][c];
      for (let k = c; k <= n; k++) m[r][k] -= f * m[c][k];
    }
  }
  return m.map((row, i) => row[n] / row[i]);
}
