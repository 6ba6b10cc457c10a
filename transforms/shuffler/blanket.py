"""The privacy blanket in the shuffler: m dummy reports in every release of a spec that asks for them.

Why: amplification by shuffling hides a device among the *other* reports of its window, and enrolled devices
that collude with the analyst send reports it knows, so they hide nobody (issue 26, finding 9: a victim alone
among 200 colluders keeps only its local epsilon). Dummies drawn from the randomizer's input-independent
component (``mechanisms.frequency.blanket``) hide the victim's report whoever else colludes; their number m
is computed from ``[crowd] blanket_epsilon`` when the spec is loaded and accounted exactly by
``transforms.privacy.blanket`` (docs/mathematics.md §1.7).

**Why the positions are sound.** The real messages of a release reach the driver in sub-key order, each
part permuted (``threshold.ReleaseFn``). A device's sub-key is a keyed PRF of the device and the window
(``dedupe``), so devices are assigned to parts independently of their values and of one another, deletions
pick whole devices uniformly, and each part is a uniform permutation: with one report per device (a blanket
spec must say so) the order of the real messages is a uniformly random permutation, independent of the data.
The m dummies go to a uniformly random m-subset of the n + m slots, so the whole sequence is a uniform
permutation of reals + dummies: a post-processing of their multiset, which is the view the accounting
assumes. Appending dummies at the end instead would let the analyzer drop them by position.

**What makes a dummy look real.** Its plaintext is the devices' padded payload encoding of a blanket draw,
sealed to the analyzer like a device's message (channel 0, the same associated data), to the key id of a
uniformly random real message of the same release (so during a key rotation the dummies' key ids follow the
reals'), with exactly the reals' ciphertext length (checked: a release is never written otherwise).

**Reproducible.** Every draw (positions, values, key ids) comes from the shuffler's PRF key labelled with
("blanket", spec_id, crowd, window end) and each dummy's sealing ephemeral from a keyed BLAKE2b of the same
label and its index: a rerun after a crash writes a byte-identical release, never a second draw. The
dummies are not records the shuffler consumed and never count toward the crowd threshold (they are added
after it, by the driver); a withheld window gets none.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from transforms.mechanisms.frequency.blanket import require_blanket
from transforms.mechanisms.randomness import keyed_generator
from transforms.shuffler.packed import Message, PackedMessages
from transforms.spec import AnalysisSpec
from transforms.trust.keys import KEY_ID_PATTERN, KeyFileError
from transforms.trust.sealing import SEAL_OVERHEAD, SEAL_VERSION, SealError, associated_data, key_id_of, seal_many
from transforms.wire.avro_payload import encode_payload, payload_pad_length
from transforms.wire.rows import array_to_rows

LABEL = "blanket"
DUMMY_CHANNEL = 0  # blanket mechanisms send one message per report, on channel 0


class Dummies(NamedTuple):
    """A release's dummies: their final slots (sorted, in [0, n + m)) and their sealed messages, slot order."""

    positions: np.ndarray
    messages: PackedMessages


def key_id_counts(messages: PackedMessages, plaintext_bytes: int) -> dict[str, int]:
    """Per analyzer key id, how many of ``messages`` a dummy may take its key id from: those whose header parses
    and whose length is what a device's sealed payload (``plaintext_bytes``) has under that id. A malformed
    message (an enrolled device's own doing) stands out with or without dummies; copying its key id or length
    would make dummies stand out too, and blocking the release on it would let one device stop a window."""
    width = messages.width()
    if width is not None and width >= 2:
        rows = np.frombuffer(messages.payload, dtype=np.uint8).reshape(len(messages), width)
        size = int(rows[0, 1])
        if np.all(rows[:, 0] == SEAL_VERSION) and np.all(rows[:, 1] == size) and \
                width == SEAL_OVERHEAD + size + plaintext_bytes:
            ids, counts = np.unique(rows[:, 2:2 + size], axis=0, return_counts=True)
            out: dict[str, int] = {}
            for raw, count in zip(ids, counts.tolist(), strict=True):
                if raw.max(initial=0) < 128:  # ascii, as key_id_of reads it
                    out[bytes(raw).decode("ascii")] = count
            return out
    out = {}
    for _, blob in messages:
        try:
            key = key_id_of(blob)
        except SealError:
            continue
        if len(blob) == SEAL_OVERHEAD + len(key) + plaintext_bytes:
            out[key] = out.get(key, 0) + 1
    return out


def merge_counts(total: dict[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """``total`` with ``more``'s counts added (one part's ``key_id_counts`` into the release's)."""
    for key, count in more.items():
        total[key] = total.get(key, 0) + count
    return total


@dataclass(frozen=True)
class ReleaseBlanket:
    """The dummies of one spec's releases: its blanket mechanism and m, the shuffler's PRF key, and every
    analyzer public key by id (a real message sealed to a key whose public half is missing is an error)."""

    spec: AnalysisSpec
    prf_key: bytes
    analyzer_keys: Mapping[str, X25519PublicKey]

    @property
    def m(self) -> int:
        return self.spec.crowd.blanket_dummies

    @property
    def plaintext_bytes(self) -> int:
        """The length of every sealed payload's plaintext of this spec (2-byte length + padded payload)."""
        return 2 + payload_pad_length(self.spec.randomizer)

    def dummies(self, crowd_id: str | None, window_end_ms: int, n_real: int, key_ids: Mapping[str, int]
                ) -> Dummies:
        """The m dummies of the release (spec, ``crowd_id``, ``window_end_ms``) of ``n_real`` real messages;
        ``key_ids`` counts the well-formed ones per analyzer key id (``key_id_counts``; see the module doc)."""
        m, spec = self.m, self.spec
        mechanism = require_blanket(spec.randomizer)
        rng = keyed_generator(self.prf_key, LABEL, spec.spec_id, str(crowd_id), window_end_ms)
        positions = np.sort(rng.choice(n_real + m, size=m, replace=False)).astype(np.int64)
        rows = array_to_rows(mechanism.blanket_reports(m, rng))
        # A well-formed key id without its public key: a rotation whose public file never reached the shuffler.
        # Skipping it would let the analyzer tell every message sealed to it real, so the release stops here.
        missing = sorted(k for k in set(key_ids) - set(self.analyzer_keys) if KEY_ID_PATTERN.fullmatch(k))
        if missing:
            raise KeyFileError(f"no analyzer public key {missing[0]} in the keys directory's public/: the shuffler "
                               "cannot seal dummies like the real messages sealed to it")
        ids = sorted(k for k in key_ids if k in self.analyzer_keys)
        if not ids:  # no well-formed real message: the newest key (there is no honest report to hide)
            ids, weights = [max(self.analyzer_keys)], np.ones(1, dtype=np.int64)
        else:
            weights = np.asarray([key_ids[k] for k in ids], dtype=np.int64)
        picks = rng.integers(0, int(weights.sum()), size=m)  # a uniformly random real message each: its key id
        chosen = np.searchsorted(np.cumsum(weights), picks, side="right")
        ad = associated_data(spec.spec_id, crowd_id, window_end_ms, DUMMY_CHANNEL)
        blobs: list[bytes] = [b""] * m
        for k in np.unique(chosen).tolist():
            at = np.flatnonzero(chosen == k).tolist()
            sealed = seal_many(self.analyzer_keys[ids[k]], ids[k], [encode_payload(spec.randomizer, rows[i])
                                                                     for i in at],
                               [ad] * len(at), [self._ephemeral(crowd_id, window_end_ms, i) for i in at])
            for i, blob in zip(at, sealed, strict=True):
                blobs[i] = blob
        wrong = [(len(b), ids[k]) for b, k in zip(blobs, chosen.tolist(), strict=True)
                 if len(b) != SEAL_OVERHEAD + len(ids[k]) + self.plaintext_bytes]
        if wrong:  # cannot happen with the devices' encoding; never publish a dummy that stands out
            raise ValueError(f"a dummy of {wrong[0][0]} bytes is not as long as the real messages sealed to "
                             f"{wrong[0][1]}; the release is not written")
        return Dummies(positions, PackedMessages.of((DUMMY_CHANNEL, b) for b in blobs))

    def _ephemeral(self, crowd_id: str | None, window_end_ms: int, index: int) -> bytes:
        """The 32 bytes of the index-th dummy's sealing key: a keyed BLAKE2b, never reused across dummies."""
        label = "\x1f".join((LABEL, self.spec.spec_id, str(crowd_id), str(window_end_ms), str(index)))
        return hashlib.blake2b(label.encode(), key=self.prf_key, digest_size=32, person=b"esa-blanket-eph").digest()


def interleave(reals: Iterator[Message], dummies: Dummies) -> Iterator[Message]:
    """The release's messages: ``reals`` in their order, each dummy at its slot."""
    slots = dummies.positions.tolist()
    at = 0
    for slot, dummy in zip(slots, dummies.messages, strict=True):
        while at < slot:
            yield next(reals)
            at += 1
        yield dummy
        at += 1
    yield from reals


def insert_layout(channels: np.ndarray, lengths: np.ndarray, dummies: Dummies) -> tuple[np.ndarray, np.ndarray]:
    """The (channel, payload length) arrays of the release with its dummies at their slots."""
    before = dummies.positions - np.arange(len(dummies.positions))  # reals before each dummy
    return (np.insert(channels, before, dummies.messages.channels),
            np.insert(lengths, before, np.diff(dummies.messages.offsets)))
