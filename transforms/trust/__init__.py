"""Trust boundaries of the pipeline: keys, device identities, sealing, signed message sets and releases.

Threat model: devices sign what they send to the shuffler with per-device Ed25519 keys enrolled once;
payloads are sealed (X25519 + HKDF-SHA256 + ChaCha20-Poly1305) to the analyzer, so the shuffler handles
them blind, and the whole signed set is sealed again to the shuffler, so what the shuffler releases never
appears on the reports topic; the shuffler signs what it releases to the analyzer; every key has a key id,
so keys rotate
(senders use the newest id, receivers keep every id they hold).

Pure library (cryptography, pyarrow, Avro via ``schemas``; no Beam, no Kafka):

* ``keys`` — the keys directory: analyzer X25519 and shuffler Ed25519 keys with rotating key ids, PRF
  and fleet secrets, race-safe creation, refusal of exposed private files;
* ``devices`` — self-certifying device ids, the enrollment registry, a simulated fleet;
* ``sealing`` — HPKE-style sealing of payloads to the analyzer, bound to the routing fields;
* ``message_set`` — device-signed message sets (device -> shuffler);
* ``envelope`` — the outer layer: each whole set sealed to the shuffler (nested encryption);
* ``release`` — shuffler-signed release batches (shuffler -> analyzer).
"""

from .devices import DeviceRegistry, SimulatedFleet, device_id_of
from .files import KeyFileError
from .keys import (
    generate_analyzer_key,
    generate_shuffler_key,
    generate_shuffler_sealing_key,
    init_keys,
    load_analyzer_private,
    load_analyzer_public,
    load_or_create_secret,
    load_shuffler_sealing_private,
    load_shuffler_sealing_public,
    load_shuffler_signer,
    load_shuffler_verifiers,
)
from .message_set import (
    AuthError,
    MessageSet,
    SealedMessage,
    decode_message_set,
    encode_message_set,
    sign_message_set,
    signing_bytes,
    verify_message_set,
)
from .release import (
    ReleaseBatch,
    decode_release_batch,
    encode_release_batch,
    release_id_of,
    sign_release_batch,
    split_into_batches,
    verify_release_batch,
)
from .sealing import SealError, associated_data, key_id_of, open_sealed, seal

__all__ = [
    "AuthError",
    "DeviceRegistry",
    "KeyFileError",
    "MessageSet",
    "ReleaseBatch",
    "SealError",
    "SealedMessage",
    "SimulatedFleet",
    "associated_data",
    "decode_message_set",
    "decode_release_batch",
    "device_id_of",
    "encode_message_set",
    "encode_release_batch",
    "generate_analyzer_key",
    "generate_shuffler_key",
    "generate_shuffler_sealing_key",
    "init_keys",
    "key_id_of",
    "load_analyzer_private",
    "load_analyzer_public",
    "load_or_create_secret",
    "load_shuffler_sealing_private",
    "load_shuffler_sealing_public",
    "load_shuffler_signer",
    "load_shuffler_verifiers",
    "open_sealed",
    "release_id_of",
    "seal",
    "sign_message_set",
    "sign_release_batch",
    "signing_bytes",
    "split_into_batches",
    "verify_message_set",
    "verify_release_batch",
]
