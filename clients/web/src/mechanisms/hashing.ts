/** The public hash families of local hashing, exact 64-bit arithmetic in BigInt (`transforms/mechanisms/hashing.py`,
 * `transforms/mechanisms/frequency/linear_hashing.py`). Public: the seed travels in the clear. */

const M64 = (1n << 64n) - 1n;
const K1 = 0x9e3779b97f4a7c15n;
const K2 = 0x87c37b91114253d5n;
const F1 = 0xff51afd7ed558ccdn;
const F2 = 0xc4ceb9fe1a85ec53n;
const GAMMA = 0x9e3779b97f4a7c15n;
const MIX1 = 0xbf58476d1ce4e5b9n;
const MIX2 = 0x94d049bb133111ebn;

export function fmix64(z: bigint): bigint {
  z = ((z ^ (z >> 33n)) * F1) & M64;
  z = ((z ^ (z >> 33n)) * F2) & M64;
  return z ^ (z >> 33n);
}

/** OLH: `H_s(v) = fmix64(fmix64((s K1) ^ v) ^ (s K2)) mod g`. */
export function hashToBucket(seed: number | bigint, value: number, g: number): number {
  const s = BigInt(seed) & M64;
  let z = fmix64(((s * K1) & M64) ^ BigInt(value));
  z = fmix64(z ^ ((s * K2) & M64));
  return Number(z % BigInt(g));
}

export function splitmix64Mix(z: bigint): bigint {
  z = ((z ^ (z >> 30n)) * MIX1) & M64;
  z = ((z ^ (z >> 27n)) * MIX2) & M64;
  return z ^ (z >> 31n);
}

function parity(x: bigint): number {
  let p = 0;
  while (x) {
    p ^= 1;
    x &= x - 1n;
  }
  return p;
}

/** LLH: bit i of the hash is the parity of `row_i & value`, rows the SplitMix64 stream of the seed. */
export function linearHash(seed: bigint, value: number, k: number): number {
  let h = 0;
  const v = BigInt(value);
  for (let i = 1; i <= k; i++) {
    const row = splitmix64Mix((seed + BigInt(i) * GAMMA) & M64);
    h += parity(row & v) << (i - 1);
  }
  return h;
}
