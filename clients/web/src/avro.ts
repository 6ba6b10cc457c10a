/**
 * The few Avro binary encodings the wire needs (zig-zag varints, length-prefixed bytes and strings), written by
 * hand as `transforms/trust/message_set_writer.py` does, so the bytes equal fastavro's.
 */
import { concat, utf8 } from "./bytes.js";

/** Avro int/long: zig-zag, then 7 bits a byte, low bits first. Exact for every int64 (BigInt inside). */
export function zigzag(value: number | bigint): Uint8Array {
  const v = BigInt(value);
  if (v < -(1n << 63n) || v >= 1n << 63n) throw new RangeError(`long out of range: ${value}`);
  let u = BigInt.asUintN(64, (v << 1n) ^ (v >> 63n));
  const out: number[] = [];
  while (u >= 0x80n) {
    out.push(Number(u & 0x7fn) | 0x80);
    u >>= 7n;
  }
  out.push(Number(u));
  return Uint8Array.from(out);
}

export function avroBytes(data: Uint8Array): Uint8Array {
  return concat(zigzag(data.length), data);
}

export function avroString(text: string): Uint8Array {
  return avroBytes(utf8(text));
}
