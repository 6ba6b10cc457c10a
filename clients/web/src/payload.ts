/**
 * A message's payload as the plaintext sealed to the analyzer (`transforms/wire/avro_payload.py`): a 2-byte
 * big-endian length, the schemaless Avro datum of the Report payload union (branch index, then the record's
 * fields), zero padding to the mechanism's fixed length (sealing hides contents, not lengths).
 */
import { avroBytes, zigzag } from "./avro.js";
import { concat } from "./bytes.js";
import type { Payload } from "./mechanisms/index.js";
import type { WireSpec } from "./spec.js";

export function payloadDatum(wire: WireSpec, payload: Payload): Uint8Array {
  switch (payload.kind) {
    case "mark":
      return zigzag(wire.mark_union_index);
    case "category":
      return concat(zigzag(wire.union_index), zigzag(payload.value));
    case "bits":
      return concat(zigzag(wire.union_index), zigzag(wire.bit_length as number), avroBytes(payload.bits));
    case "hashed":
      return concat(zigzag(wire.union_index), zigzag(payload.seed), zigzag(payload.z));
  }
}

export function encodePayload(wire: WireSpec, payload: Payload): Uint8Array {
  const datum = payloadDatum(wire, payload);
  if (datum.length > wire.pad_length) throw new Error(`payload of ${datum.length} bytes exceeds the bound of ${wire.pad_length}`);
  const out = new Uint8Array(2 + wire.pad_length);
  out[0] = datum.length >> 8;
  out[1] = datum.length & 0xff;
  out.set(datum, 2);
  return out;
}
