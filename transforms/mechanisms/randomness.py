"""Where randomness comes from (docs/mathematics.md §8).

Production randomizers draw from OS entropy (:func:`os_entropy_rng`). Seeds exist for tests and
simulations only and say so loudly in the log. Where Beam may re-run a DoFn, randomness must be a
function of (secret job key, stable element id) so that a retry reproduces the *same* report: two
different randomizations of one input that both escape through an at-least-once sink would spend its
epsilon twice. :class:`KeyedRandom` provides that, row by row, independently of batch boundaries.

Only numpy and the standard library are used: this is the library a device could run.
"""

from __future__ import annotations

import hashlib
import logging
import secrets

import numpy as np

__all__ = [
    "KeyedRandom",
    "element_id",
    "job_key_from_entropy",
    "job_key_from_seed",
    "os_entropy_rng",
    "seeded_rng",
    "siphash24",
    "splitmix64_mix",
    "topic_hash",
]

log = logging.getLogger(__name__)

_U64 = np.uint64
_SEEDED_WARNING = "seeded randomness: for tests and simulations only"
_seeded_warned = False

_GOLDEN_GAMMA = _U64(0x9E3779B97F4A7C15)  # SplitMix64 increment (odd)
_MIX1 = _U64(0xBF58476D1CE4E5B9)
_MIX2 = _U64(0x94D049BB133111EB)
_TWO_POW_M53 = 2.0**-53
MAX_INTEGER_RANGE = 2**32


def _warn_seeded() -> None:
    """Log the seeded-randomness warning once per process (it is meant to be seen, not to flood logs)."""
    global _seeded_warned
    if not _seeded_warned:
        log.warning(_SEEDED_WARNING)
        _seeded_warned = True


def os_entropy_rng() -> np.random.Generator:
    """The production default: a PCG64 generator seeded with 128 bits of OS entropy."""
    return np.random.default_rng(secrets.randbits(128))


def seeded_rng(seed: int) -> np.random.Generator:
    """A reproducible generator for tests and simulations; never for real clients (logged once)."""
    _warn_seeded()
    return np.random.default_rng(seed)


def seeded_stream(seed: int, purpose: str, index: int = 0) -> np.random.Generator:
    """A reproducible generator for one ``purpose`` (and ``index``) of a seeded simulation, independent of
    ``seeded_rng(seed)`` and of every other (purpose, index); tests and simulations only, logged once.

    Why not ``default_rng([seed, index])``: numpy's ``SeedSequence`` pads its entropy with zero words, so
    ``[seed, 0]`` seeds the very stream ``seed`` does. The demo's first chunk of devices was randomized with the
    stream that had drawn their values: GRR kept a device's value exactly when it was item 0, and the seeded demo
    estimated item 0 at 0.67 against a truth of 0.25 (z = 16.9). A spawn key keeps the streams apart."""
    _warn_seeded()
    tag = int.from_bytes(hashlib.blake2b(purpose.encode("utf-8"), digest_size=4).digest(), "big")
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(tag, index)))


def job_key_from_entropy() -> bytes:
    """A fresh secret 16-byte job key for :meth:`KeyedRandom.for_elements` (the production default)."""
    return secrets.token_bytes(16)


def job_key_from_seed(seed: int) -> bytes:
    """A job key derived from a seed (blake2b); tests and simulations only, logged once."""
    _warn_seeded()
    data = int(seed).to_bytes(16, "little", signed=True)
    return hashlib.blake2b(data, digest_size=16, person=b"esa-job-key").digest()


def keyed_generator(key: bytes, *parts: str | int) -> np.random.Generator:
    """A numpy Generator (Philox) whose stream is a keyed PRF (BLAKE2b) of ``parts``.

    The shuffler draws from these: the same crowd or sub-crowd gets the same stream on a Beam retry or a
    Flink replay (so a replay cannot release a second, differently noised version of a crowd), while
    nobody without the secret key can predict it.
    """
    digest = hashlib.blake2b(repr(parts).encode(), key=key, digest_size=16, person=b"esa-keyed-gen").digest()
    return np.random.Generator(np.random.Philox(key=int.from_bytes(digest, "little")))


def keyed_index(key: bytes, text: str, modulus: int) -> int:
    """A keyed-PRF index of ``text`` in [0, modulus): a stable, unpredictable assignment."""
    digest = hashlib.blake2b(text.encode(), key=key, digest_size=8, person=b"esa-keyed-idx").digest()
    return int.from_bytes(digest, "little") % modulus


def keyed_indices(key: bytes, prefix: str, suffixes: bytes, width: int) -> np.ndarray:
    """``keyed_index(key, prefix + s, 1 << 64)`` for each ``width``-byte ASCII suffix ``s`` in ``suffixes``,
    as uint64: the keyed state is built once and copied per text (the shuffler ranks every device of a
    window; constructing a keyed BLAKE2b per device cost about a microsecond more each)."""
    base = hashlib.blake2b(key=key, digest_size=8, person=b"esa-keyed-idx")
    base.update(prefix.encode())
    digests = []
    for start in range(0, len(suffixes), width):
        h = base.copy()
        h.update(suffixes[start:start + width])
        digests.append(h.digest())
    return np.frombuffer(b"".join(digests), dtype="<u8").astype(np.uint64)


def _rotl(x: np.ndarray, b: int) -> np.ndarray:
    return (x << _U64(b)) | (x >> _U64(64 - b))


def _sipround(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, v3: np.ndarray) -> tuple[np.ndarray, ...]:
    v0 = v0 + v1
    v1 = _rotl(v1, 13) ^ v0
    v0 = _rotl(v0, 32)
    v2 = v2 + v3
    v3 = _rotl(v3, 16) ^ v2
    v0 = v0 + v3
    v3 = _rotl(v3, 21) ^ v0
    v2 = v2 + v1
    v1 = _rotl(v1, 17) ^ v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


def siphash24(key: bytes, messages: np.ndarray) -> np.ndarray:
    """SipHash-2-4 of each element, taken as an 8-byte little-endian message, under a 16-byte key.

    A keyed PRF: without the job key nobody (including the shuffler) can predict a client's randomness
    from its public element id. Only 8-byte messages are supported, which is all the callers need.
    """
    if len(key) != 16:
        raise ValueError(f"SipHash key must be 16 bytes, got {len(key)}")
    m = np.asarray(messages)
    if m.size and not np.issubdtype(m.dtype, np.integer):
        raise TypeError(f"messages must be integers, got dtype {m.dtype}")
    m = m.astype(_U64, copy=False)
    k0 = _U64(int.from_bytes(key[:8], "little"))
    k1 = _U64(int.from_bytes(key[8:], "little"))
    with np.errstate(over="ignore"):
        v0 = np.full(m.shape, k0 ^ _U64(0x736F6D6570736575), dtype=_U64)
        v1 = np.full(m.shape, k1 ^ _U64(0x646F72616E646F6D), dtype=_U64)
        v2 = np.full(m.shape, k0 ^ _U64(0x6C7967656E657261), dtype=_U64)
        v3 = np.full(m.shape, k1 ^ _U64(0x7465646279746573), dtype=_U64)
        v3 = v3 ^ m
        for _ in range(2):
            v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 = v0 ^ m
        last = _U64(8 << 56)  # final block: message length 8 in the top byte, no trailing bytes
        v3 = v3 ^ last
        for _ in range(2):
            v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 = v0 ^ last
        v2 = v2 ^ _U64(0xFF)
        for _ in range(4):
            v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        return v0 ^ v1 ^ v2 ^ v3


def splitmix64_mix(z: np.ndarray) -> np.ndarray:
    """The SplitMix64 output function (a bijection of uint64 with full avalanche)."""
    z = np.asarray(z, dtype=_U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> _U64(30))) * _MIX1
        z = (z ^ (z >> _U64(27))) * _MIX2
        return z ^ (z >> _U64(31))


def topic_hash(topic: str) -> int:
    """A stable 64-bit id of a Kafka topic name (blake2b, 8 bytes, little-endian)."""
    return int.from_bytes(hashlib.blake2b(topic.encode("utf-8"), digest_size=8).digest(), "little")


def element_id(partition: np.ndarray | int, offset: np.ndarray | int, topic_hash: np.ndarray | int) -> np.ndarray:
    """Stable uint64 ids of Kafka records (topic, partition, offset), vectorised.

    ``id = mix(mix(topic_hash + partition * gamma) ^ offset)`` with ``mix`` the SplitMix64 bijection:
    within one partition distinct offsets never collide (a bijection of the offset); across partitions
    and topics a collision has probability 2^-64 per pair. The id is public; secrecy comes from the
    job key applied in :meth:`KeyedRandom.for_elements`. Every argument may be a scalar or an array
    (broadcast), so a batch mixing topics passes one topic hash per element.
    """
    part, off, topic = (np.asarray(x).astype(_U64) for x in (partition, offset, topic_hash))
    with np.errstate(over="ignore"):
        base = splitmix64_mix(topic + part * _GOLDEN_GAMMA)
        return np.atleast_1d(splitmix64_mix(base ^ off))


def _shape(size: int | tuple[int, ...]) -> tuple[int, ...]:
    shape = (int(size),) if isinstance(size, int | np.integer) else tuple(int(s) for s in size)
    if not shape or min(shape) < 0:
        raise ValueError(f"invalid draw size {size!r}")
    return shape


class KeyedRandom:
    """Per-element reproducible randomness implementing ``base.Randomness``.

    Row ``i`` of every draw is read from a SplitMix64 stream keyed by ``element_keys[i]``: word ``j``
    of that stream is ``mix(key_i + (j + 1) * gamma)``, and ``j`` advances with every draw (a draw of
    shape ``(n, k)`` consumes ``k`` words of every row). Row ``i`` therefore depends only on key ``i`` and
    on the sequence of draw shapes, never on which other elements share the batch: re-encoding a retried
    bundle with different boundaries reproduces the same reports. Create a new instance per
    (batch, purpose); a retry must start from a new instance too.

    Two elements share a word only if their keys lie within a few multiples of ``gamma`` of each other:
    probability about ``n^2 * words_per_row / 2^64`` per job (5e-4 for 10^8 elements).
    """

    def __init__(self, element_keys: np.ndarray) -> None:
        keys = np.asarray(element_keys)
        if keys.ndim != 1:
            raise ValueError(f"element_keys must be 1-D, got shape {keys.shape}")
        if keys.size and not np.issubdtype(keys.dtype, np.integer):
            raise TypeError(f"element_keys must be uint64, got dtype {keys.dtype}")
        self._keys = keys.astype(_U64, copy=True)
        self._counter = 0

    @classmethod
    def for_elements(cls, job_key: bytes, element_ids: np.ndarray, purpose: str = "") -> KeyedRandom:
        """Keys = SipHash-2-4(job key, element id); ``purpose`` derives an independent sub-key."""
        if purpose:
            job_key = hashlib.blake2b(purpose.encode("utf-8"), key=job_key, digest_size=16).digest()
        return cls(siphash24(job_key, np.asarray(element_ids)))

    def __len__(self) -> int:
        return int(self._keys.size)

    def _words(self, size: int | tuple[int, ...]) -> np.ndarray:
        shape = _shape(size)
        if shape[0] != self._keys.size:
            raise ValueError(
                f"draw of shape {shape}: the first dimension must be the number of elements ({self._keys.size})"
            )
        per_row = int(np.prod(shape[1:], dtype=np.int64))
        ctr = np.arange(self._counter + 1, self._counter + per_row + 1, dtype=_U64)
        self._counter += per_row
        with np.errstate(over="ignore"):
            state = self._keys[:, None] + ctr[None, :] * _GOLDEN_GAMMA
        return splitmix64_mix(state).reshape(shape)

    def random(self, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform float64 in [0, 1) from the top 53 bits of each word (exact multiples of 2^-53)."""
        return (self._words(size) >> _U64(11)).astype(np.float64) * _TWO_POW_M53

    def integers(self, low: int | np.ndarray, high: int | np.ndarray, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform int64 in [low, high) as ``low + floor(u * (high - low))``.

        With 53-bit ``u`` every value of a range ``r`` gets ``2^53 / r`` grid points up to +-2, i.e. a
        relative bias of at most ``r * 2^-52`` (< 2^-39 for r < 2^13, the domains we randomize over);
        ranges above 2^32 are refused (the bias would reach 2^-20).
        """
        u = self.random(size)
        lo = np.asarray(low, dtype=np.int64)
        hi = np.asarray(high, dtype=np.int64)
        span = hi - lo
        if span.size and (span.min() < 1 or span.max() > MAX_INTEGER_RANGE):
            raise ValueError(f"integer range must satisfy 1 <= high - low <= 2^32, got {span.min()}..{span.max()}")
        out = lo + np.floor(u * span).astype(np.int64)
        return np.minimum(out, hi - 1)  # float rounding can never reach high; this makes it a guarantee
