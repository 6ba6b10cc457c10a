/**
 * The one-shot seal of `transforms/trust/sealing.py` and the envelope of `transforms/trust/envelope.py`:
 * a fresh ephemeral X25519 key per blob, key = HKDF-SHA256(shared secret, salt = eph_pub || recipient_pub,
 * info = "esa-seal-v1"), ChaCha20-Poly1305 under a zero nonce (each key encrypts exactly one message).
 *
 * Blob: `0x01 | u8 len(key_id) | key_id (ascii) | eph_pub (32) | ciphertext || tag (16)`.
 * Messages are sealed to the analyzer with the routing fields as associated data; the encoded, signed set is
 * sealed again, whole, to the shuffler (nested encryption) with the envelope's own domain tag.
 */
import { chacha20poly1305 } from "@noble/ciphers/chacha.js";
import { x25519 } from "@noble/curves/ed25519.js";
import { hkdf } from "@noble/hashes/hkdf.js";
import { sha256 } from "@noble/hashes/sha2.js";
import { concat, utf8 } from "./bytes.js";
import { i64, optionalText, tagged, text } from "./canonical.js";

export const SEAL_TAG = utf8("esa-seal-v1");
export const SEAL_VERSION = 1;
export const ENVELOPE_AD = tagged(utf8("esa-envelope-v1"));
const ZERO_NONCE = new Uint8Array(12);

/** The routing fields that survive the shuffle, canonically encoded and domain-separated. */
export function associatedData(specId: string, crowdId: string | null, windowEndMs: number, channel: number): Uint8Array {
  return tagged(SEAL_TAG, text(specId), optionalText(crowdId), i64(windowEndMs), i64(channel));
}

function header(keyId: string): Uint8Array {
  if (!/^[\x00-\x7f]{1,255}$/.test(keyId)) throw new Error(`key id must be 1..255 ascii characters, got ${JSON.stringify(keyId)}`);
  return concat(Uint8Array.of(SEAL_VERSION, keyId.length), utf8(keyId));
}

/**
 * Seal `plaintext` to the X25519 public key `recipient` (id `keyId`), bound to `associated`.
 * `ephemeral`: 32 bytes of fresh private key material (never reused); the SDK draws it from crypto.getRandomValues.
 */
export function seal(recipient: Uint8Array, keyId: string, plaintext: Uint8Array, associated: Uint8Array,
                     ephemeral: Uint8Array): Uint8Array {
  if (ephemeral.length !== 32) throw new Error(`ephemeral key material must be 32 bytes, got ${ephemeral.length}`);
  if (recipient.length !== 32) throw new Error(`an X25519 public key is 32 bytes, got ${recipient.length}`);
  const ephPub = x25519.getPublicKey(ephemeral);
  const shared = x25519.getSharedSecret(ephemeral, recipient);
  const key = hkdf(sha256, shared, concat(ephPub, recipient), SEAL_TAG, 32);
  const sealed = chacha20poly1305(key, ZERO_NONCE, associated).encrypt(plaintext);
  return concat(header(keyId), ephPub, sealed);
}

/** Open a blob (tests and tools only: a device never opens anything). Throws on any failure. */
export function open(privateKey: Uint8Array, blob: Uint8Array, associated: Uint8Array): Uint8Array {
  if (blob.length < 2 || blob[0] !== SEAL_VERSION) throw new Error("not a sealed blob");
  const n = blob[1];
  const ephPub = blob.subarray(2 + n, 2 + n + 32);
  const recipient = x25519.getPublicKey(privateKey);
  const shared = x25519.getSharedSecret(privateKey, ephPub);
  const key = hkdf(sha256, shared, concat(ephPub, recipient), SEAL_TAG, 32);
  return chacha20poly1305(key, ZERO_NONCE, associated).decrypt(blob.subarray(2 + n + 32));
}

/** The encoded, signed message set sealed whole to the shuffler key `keyId`. */
export function sealEnvelope(shuffler: Uint8Array, keyId: string, encodedSet: Uint8Array, ephemeral: Uint8Array): Uint8Array {
  return seal(shuffler, keyId, encodedSet, ENVELOPE_AD, ephemeral);
}
