/**
 * Canonical, injective encodings of signed fields and associated data (`transforms/trust/canonical.py`): every
 * variable-length field has a 4-byte big-endian length, every optional field a presence byte.
 */
import { concat, i64be, u32be, utf8 } from "./bytes.js";

export function blob(data: Uint8Array): Uint8Array {
  return concat(u32be(data.length), data);
}

export function text(value: string): Uint8Array {
  return blob(utf8(value));
}

export function optionalText(value: string | null): Uint8Array {
  return value === null ? Uint8Array.of(0) : concat(Uint8Array.of(1), text(value));
}

export function i64(value: number | bigint): Uint8Array {
  if (typeof value === "number" && !Number.isSafeInteger(value)) throw new TypeError(`expected an integer, got ${value}`);
  return i64be(value);
}

export function tagged(tag: Uint8Array, ...parts: Uint8Array[]): Uint8Array {
  return concat(blob(tag), ...parts);
}
