/**
 * Where a report's randomness comes from. The randomizers draw only through `Randomness`, with the draw shapes of
 * their Python twins (`transforms/mechanisms`), so the golden vectors can replay Python's coins draw by draw
 * (`ReplayRandomness`), while production draws from `crypto.getRandomValues` (`CryptoRandomness`).
 */

export interface Randomness {
  /** Uniform doubles in [0, 1), `shape` = [n] or [n, width], flattened row-major. */
  random(shape: number[]): number[];
  /** Uniform integers in [low, high) (`high` may be one bound per row), flattened row-major. */
  integers(low: number, high: number | number[], shape: number[]): number[];
  /** Fresh random bytes (nonces, ephemeral keys). */
  bytes(n: number): Uint8Array;
}

const MAX_RANGE = 2 ** 32;

function size(shape: number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Production randomness: the platform CSPRNG (browser and Node 20 `globalThis.crypto`). */
export class CryptoRandomness implements Randomness {
  private words(n: number): Uint32Array {
    const out = new Uint32Array(n);
    for (let at = 0; at < n; at += 16384) crypto.getRandomValues(out.subarray(at, Math.min(n, at + 16384)));
    return out;
  }

  /** 53-bit uniforms: exact multiples of 2^-53, as numpy's `Generator.random`. */
  random(shape: number[]): number[] {
    const n = size(shape);
    const w = this.words(2 * n);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) out[i] = ((w[2 * i] >>> 5) * 67108864 + (w[2 * i + 1] >>> 6)) / 9007199254740992;
    return out;
  }

  /** Unbiased (rejection sampling on 32-bit words), ranges up to 2^32. */
  integers(low: number, high: number | number[], shape: number[]): number[] {
    const n = size(shape);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const hi = Array.isArray(high) ? high[Math.floor(i / (n / high.length))] : high;
      const span = hi - low;
      if (!Number.isInteger(span) || span < 1 || span > MAX_RANGE) throw new RangeError(`integer range ${span} outside [1, 2^32]`);
      if (span === MAX_RANGE) {
        out[i] = low + this.words(1)[0];
        continue;
      }
      const limit = MAX_RANGE - (MAX_RANGE % span);
      let x: number;
      do x = this.words(1)[0]; while (x >= limit);
      out[i] = low + (x % span);
    }
    return out;
  }

  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    crypto.getRandomValues(out);
    return out;
  }
}

/** One recorded draw of the Python client (`pipelines/golden_vectors.py`'s `RecordingRandom`). */
export type Draw =
  | { op: "random"; shape: number[]; values: number[] }
  | { op: "integers"; low: number; high: number | number[]; shape: number[]; values: number[] }
  | { op: "bytes"; n: number; hex: string };

function same(a: unknown, b: unknown): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/** Replays recorded draws in order; throws on the first draw asked for with another kind, shape or range. */
export class ReplayRandomness implements Randomness {
  private at = 0;

  constructor(private readonly draws: Draw[]) {}

  private next(what: string): Draw {
    const d = this.draws[this.at++];
    if (!d) throw new Error(`draw ${this.at - 1} (${what}) was not made by the Python client`);
    return d;
  }

  random(shape: number[]): number[] {
    const d = this.next(`random ${JSON.stringify(shape)}`);
    if (d.op !== "random" || !same(d.shape, shape)) throw new Error(`draw ${this.at - 1}: asked random ${JSON.stringify(shape)}, recorded ${JSON.stringify({ ...d, values: undefined })}`);
    return d.values.slice();
  }

  integers(low: number, high: number | number[], shape: number[]): number[] {
    const d = this.next(`integers ${low} ${JSON.stringify(high)}`);
    if (d.op !== "integers" || d.low !== low || !same(d.high, high) || !same(d.shape, shape)) {
      throw new Error(`draw ${this.at - 1}: asked integers(${low}, ${JSON.stringify(high)}, ${JSON.stringify(shape)}), recorded ${JSON.stringify({ ...d, values: undefined })}`);
    }
    return d.values.slice();
  }

  bytes(n: number): Uint8Array {
    const d = this.next(`bytes ${n}`);
    if (d.op !== "bytes" || d.n !== n) throw new Error(`draw ${this.at - 1}: asked ${n} bytes, recorded ${d.op}`);
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = parseInt(d.hex.slice(2 * i, 2 * i + 2), 16);
    return out;
  }

  /** True once every recorded draw was consumed (a client that draws less than Python fails the vectors too). */
  get exhausted(): boolean {
    return this.at === this.draws.length;
  }
}

/** A small seeded generator for statistical tests only (xoshiro128**, 53-bit doubles). Never for real reports. */
export class SeededRandomness implements Randomness {
  private s: Uint32Array;

  constructor(seed: number) {
    this.s = new Uint32Array(4);
    let z = seed >>> 0;
    for (let i = 0; i < 4; i++) {
      z = (z + 0x9e3779b9) >>> 0;
      let t = z;
      t = Math.imul(t ^ (t >>> 16), 0x85ebca6b) >>> 0;
      t = Math.imul(t ^ (t >>> 13), 0xc2b2ae35) >>> 0;
      this.s[i] = (t ^ (t >>> 16)) >>> 0;
    }
  }

  private word(): number {
    const s = this.s;
    const result = Math.imul(((Math.imul(s[1], 5) << 7) | (Math.imul(s[1], 5) >>> 25)) >>> 0, 9) >>> 0;
    const t = (s[1] << 9) >>> 0;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = ((s[3] << 11) | (s[3] >>> 21)) >>> 0;
    return result;
  }

  random(shape: number[]): number[] {
    const n = size(shape);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) out[i] = ((this.word() >>> 5) * 67108864 + (this.word() >>> 6)) / 9007199254740992;
    return out;
  }

  integers(low: number, high: number | number[], shape: number[]): number[] {
    const n = size(shape);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const hi = Array.isArray(high) ? high[Math.floor(i / (n / high.length))] : high;
      const span = hi - low;
      if (span === MAX_RANGE) {
        out[i] = low + this.word();
        continue;
      }
      const limit = MAX_RANGE - (MAX_RANGE % span);
      let x: number;
      do x = this.word(); while (x >= limit);
      out[i] = low + (x % span);
    }
    return out;
  }

  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.word() & 0xff;
    return out;
  }
}
