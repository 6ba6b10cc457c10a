/**
 * Production randomness (crypto.getRandomValues) has the shapes and ranges the randomizers rely on: doubles in
 * [0, 1) on the 2^-53 grid, integers in [low, high) for every range up to 2^32, per-row bounds, fresh bytes.
 * (Its statistical quality is the platform CSPRNG's; the laws of the randomizers are tested with fixed seeds.)
 */
import { describe, expect, it } from "vitest";
import { CryptoRandomness, ReplayRandomness } from "../../src/random.js";

describe("CryptoRandomness", () => {
  const rng = new CryptoRandomness();

  it("draws 53-bit doubles in [0, 1)", () => {
    const u = rng.random([1000, 3]);
    expect(u).toHaveLength(3000);
    for (const x of u) {
      expect(x >= 0 && x < 1).toBe(true);
      expect(Number.isInteger(x * 2 ** 53)).toBe(true);
    }
    expect(new Set(u).size).toBeGreaterThan(2990);
  });

  it("draws integers in [low, high), whole 2^32 ranges and per-row bounds included", () => {
    for (const [low, high] of [[0, 1], [0, 2], [5, 12], [0, 2 ** 32 - 1], [0, 2 ** 32]] as const) {
      for (const x of rng.integers(low, high, [500])) expect(Number.isInteger(x) && x >= low && x < high).toBe(true);
    }
    const rows = rng.integers(0, [2, 1000, 2 ** 20], [3]);
    expect(rows[0]).toBeLessThan(2);
    expect(rows[1]).toBeLessThan(1000);
    expect(new Set(rng.integers(0, 3, [300]))).toEqual(new Set([0, 1, 2]));
    expect(() => rng.integers(0, 2 ** 32 + 1, [1])).toThrow(RangeError);
  });

  it("gives fresh bytes every call", () => {
    const a = rng.bytes(32);
    const b = rng.bytes(32);
    expect(a).toHaveLength(32);
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(false);
  });
});

describe("ReplayRandomness", () => {
  it("refuses a draw of another kind or shape than the recorded one", () => {
    const replay = new ReplayRandomness([{ op: "random", shape: [1], values: [0.5] }]);
    expect(() => replay.integers(0, 2, [1])).toThrow(/recorded/);
    expect(() => new ReplayRandomness([{ op: "random", shape: [1, 2], values: [0.1, 0.2] }]).random([1])).toThrow(/recorded/);
    expect(() => new ReplayRandomness([]).bytes(16)).toThrow(/not made/);
  });
});
