/**
 * MessageSet: every message of one event, each sealed to the analyzer, signed by the device's Ed25519 key
 * (`transforms/trust/message_set.py`), written as the single-object Avro datum of `schemas/MessageSet.avsc`
 * (`transforms/trust/message_set_writer.py`).
 */
import { ed25519 } from "@noble/curves/ed25519.js";
import { avroBytes, avroString, zigzag } from "./avro.js";
import { concat, fromHex, utf8 } from "./bytes.js";
import { blob, i64, optionalText, tagged, text } from "./canonical.js";

export const MESSAGE_SET_TAG = utf8("esa-messageset-v1");
export const NONCE_BYTES = 16;

export interface SealedMessage {
  channel: number;
  sealed: Uint8Array;
}

export interface MessageSet {
  specId: string;
  crowdId: string | null;
  deviceId: string;
  eventTimeMs: number;
  nonce: Uint8Array;
  keyId: string;
  messages: SealedMessage[];
  signature?: Uint8Array;
}

/** Canonical encoding of the ordered message list: count, then channel and blob of each. */
export function messagesBytes(messages: SealedMessage[]): Uint8Array {
  return concat(i64(messages.length), ...messages.flatMap((m) => [i64(m.channel), blob(m.sealed)]));
}

/** What the device signs: every field but the signature, canonical and domain-separated. */
export function signingBytes(ms: MessageSet): Uint8Array {
  return tagged(MESSAGE_SET_TAG, text(ms.specId), optionalText(ms.crowdId), text(ms.deviceId), i64(ms.eventTimeMs),
    blob(ms.nonce), text(ms.keyId), messagesBytes(ms.messages));
}

/** The 64-byte Ed25519 signature (RFC 8032, deterministic) of the set under the device's 32-byte seed. */
export function signMessageSet(ms: MessageSet, deviceSeed: Uint8Array): Uint8Array {
  return ed25519.sign(signingBytes(ms), deviceSeed);
}

/** The single-object Avro encoding; `header` is the spec export's `wire.message_set_header` (C3 01 + fingerprint). */
export function encodeMessageSet(ms: MessageSet, header: Uint8Array | string, schemaVersion = 1): Uint8Array {
  if (!ms.signature || ms.signature.length !== 64) throw new Error("sign the message set before encoding it");
  if (ms.nonce.length !== NONCE_BYTES) throw new Error(`nonce must be ${NONCE_BYTES} bytes`);
  if (ms.messages.length < 1) throw new Error("a message set holds at least one message");
  const head = typeof header === "string" ? fromHex(header) : header;
  const parts: Uint8Array[] = [head, zigzag(schemaVersion), avroString(ms.specId)];
  parts.push(ms.crowdId === null ? Uint8Array.of(0) : concat(Uint8Array.of(2), avroString(ms.crowdId)));
  parts.push(avroString(ms.deviceId), zigzag(ms.eventTimeMs), avroBytes(ms.nonce), avroString(ms.keyId));
  parts.push(zigzag(ms.messages.length));
  for (const m of ms.messages) parts.push(zigzag(m.channel), avroBytes(m.sealed));
  parts.push(Uint8Array.of(0), avroBytes(ms.signature));
  return concat(...parts);
}
