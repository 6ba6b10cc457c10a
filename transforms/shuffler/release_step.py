"""The shuffler's release step, in the driver: seal each closed window's release, publish it, mark it in the ledger.

Shared by the bounded shuffle job and the streaming shuffler's release agent, so that both seal, publish,
withhold and republish by the same rules: a release is sealed (its file written and its ledger entry made)
before it is published, so a crash between the two republishes the identical bytes and never re-draws.

What it writes to is a ``ReleaseTarget``, named there and nothing more: the state directory's release files and
dead letters, the keys, the shuffled topic. Each release is published in one Kafka transaction under the stream's
one transactional id (``esa-shuffler-<shuffled topic>``, the prefix the broker ACLs grant the shuffler,
``pipelines.broker.acls``; ``transforms.io.kafka.writer``): all its batches visible or none, and a second
shuffler started against the same topic (a restarted one, or another with its own keys and state) fences this
one, whose next publish fails with ``ShufflerFencedError`` (exit 9) instead of publishing a second release of a
window. What a fenced shuffler had sealed stays in its ledger, unpublished, and is republished byte for byte if
that shuffler (and only it) is started again.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transforms.io.kafka.writer import FencedError, KafkaTarget, transactional_writer
from transforms.io.staging import (
    Location,
    StagedEntry,
    StageFn,
    iter_staged_entries,
)
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.runtime.faults import crash_point
from transforms.shuffler.blanket import ReleaseBlanket
from transforms.shuffler.graph import PartHeader, ReleasePart, part_header
from transforms.shuffler.release_files import ReleaseFile, file_digest, iter_batches, part_name, write_release
from transforms.spec import AnalysisSpec, SpecSet
from transforms.state.layout import StateDir
from transforms.state.ledger import WITHHELD, ReleaseEntry, ReleaseKey, ReleaseLedger
from transforms.trust.keys import KeyFileError, load_analyzer_publics, load_or_create_secret, load_shuffler_signer
from transforms.trust.layout import KeysDir
from transforms.trust.release import release_id_of

LOG = logging.getLogger("pipelines.shuffle")

STAGE = "shuffle"
PART = "part"  # staging prefix of release parts
TRANSACTIONAL_PREFIX = "esa-shuffler"  # pipelines.broker.acls.SHUFFLER_TRANSACTIONAL_PREFIX
PUBLISH_TIMEOUT_S = 60.0


class ShufflerFencedError(FencedError):
    """Another shuffler took over this stream's transactional id: this one must stop publishing (exit 9)."""


class BlanketKeyError(KeyFileError):
    """A spec's blanket needs an analyzer public key the keys directory lacks: the operator's to fix (exit 3)."""


@dataclass(frozen=True)
class ReleaseTarget:
    """Exactly what the release step writes to: the stage's state directory (release files, dead letters), the
    keys directory (its signer, the analyzer's public keys, its PRF key), the shuffled topic, and the shuffler
    domain's dead-letter topic if letters are published. ``seed`` replaces the PRF key in tests only."""

    state: StateDir
    keys: Path
    stream: KafkaTarget
    dead_letter_stream: KafkaTarget | None = None
    seed: int | None = None


def transactional_id(shuffled_topic: str) -> str:
    """The stream's one transactional id: every shuffler publishing ``shuffled_topic`` uses it."""
    return f"{TRANSACTIONAL_PREFIX}-{shuffled_topic}"


def shuffler_prf_key(keys: Path, seed: int | None = None) -> bytes:
    """The shuffler's persisted PRF key (16 bytes for SipHash); a test seed replaces it only when given."""
    if seed is not None:
        return job_key_from_seed(seed + 0x5EED)
    return load_or_create_secret(KeysDir(keys).shuffler_prf_key)[:16]


class Blankets:
    """The privacy blanket of each spec the shuffler serves (``transforms.shuffler.blanket``), None for a spec
    without dummies; the analyzer's public keys are read once, when a spec first needs them."""

    def __init__(self, target: ReleaseTarget, specs: Sequence[AnalysisSpec]):
        self._target, self._specs = target, SpecSet(specs)
        self._keys: dict | None = None

    def of(self, spec_id: str) -> ReleaseBlanket | None:
        spec = self._specs.get(spec_id)
        if spec is None or not spec.crowd.blanket_dummies:
            return None
        if self._keys is None:
            self._keys = load_analyzer_publics(self._target.keys)
        return ReleaseBlanket(spec, shuffler_prf_key(self._target.keys, self._target.seed), self._keys)

    def write(self, parts: StagedParts, key_id: str, signer: object) -> ReleaseFile:
        """``write_release`` of one staged release with its spec's blanket; a missing analyzer public key is
        the operator's to fix (exit 3, naming the key id), never a traceback."""
        try:
            return write_release(self._target.state.releases, parts, key_id, signer, headers=parts.headers,
                                 blanket=self.of(parts.key.spec_id))
        except KeyFileError as err:
            raise BlanketKeyError(f"cannot add the blanket's dummies to {parts.key.spec_id}: {err}") from None


def part_stager(staging: Location) -> StageFn:
    """The stage that writes release parts, each with its ``PartHeader`` in the batch's index."""
    return StageFn(staging, PART, part_name, header_of=part_header)


class StagedParts(Sequence[ReleasePart]):
    """The staged parts of one release, in sub-key order: their headers held, each part read from staging
    when accessed and not kept, so the driver holds one part (a sub-crowd) at a time, however large the
    crowd, and reads no part's messages to group, count or withhold a release (``headers``)."""
    def __init__(self, entries: Sequence[StagedEntry], headers: Sequence[PartHeader] | None = None):
        self._entries = list(entries)
        self.headers = list(headers) if headers is not None else [header_of(e) for e in self._entries]

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> ReleasePart:  # type: ignore[override]
        return self._entries[index].load()

    @property
    def key(self) -> ReleaseKey:
        return release_key(self.headers)

    @property
    def withheld(self) -> bool:
        return is_withheld(self.headers)


def header_of(entry: StagedEntry) -> PartHeader:
    """A staged part's header, from the batch's index; a part staged without one (by an earlier esa) is read."""
    return entry.header if isinstance(entry.header, PartHeader) else part_header(entry.load())


def staged_releases(staging: Location) -> Iterator[StagedParts]:
    """The staged parts, one release at a time (part names start with the release id), sub-key order."""
    headed = ((header_of(e), e) for e in iter_staged_entries(staging, PART))
    for _, group in itertools.groupby(headed, key=lambda he: release_key([he[0]])):
        headers, entries = zip(*group, strict=True)
        yield StagedParts(entries, headers)


def publish(target: ReleaseTarget, release_id: str, path: Path) -> int:
    """Produce a release's batches from its file, keyed ``release_id:index``, in one Kafka transaction under the
    stream's transactional id (see the module doc). Raises unless the transaction committed; ShufflerFencedError
    once a second shuffler took the stream over."""
    stream = target.stream
    writer = transactional_writer(stream, transactional_id(stream.topic), timeout_s=PUBLISH_TIMEOUT_S,
                                  client_id=TRANSACTIONAL_PREFIX)
    try:
        return writer.write((f"{release_id}:{i}".encode(), data) for i, data in enumerate(iter_batches(path)))
    except FencedError as err:
        raise ShufflerFencedError(f"another shuffler publishes to {stream.topic!r} now; this one was fenced: "
                                  f"{err}", err.cause) from None


def republish_unpublished(target: ReleaseTarget, ledger: ReleaseLedger) -> int:
    """Crash recovery: releases sealed by a run that died before publishing them go out now, identical."""
    done = 0
    for entry in ledger.unpublished():
        path = target.state.release_file(entry.release_id)
        if file_digest(path) != entry.digest:
            raise RuntimeError(f"staged release {entry.release_id} does not match its ledger digest; refusing "
                               "to publish (state directory damaged?)")
        publish(target, entry.release_id, path)
        ledger.mark_published(entry.key)
        done += 1
    if done:
        LOG.warning("republished %d release(s) sealed by an interrupted run", done)
    return done


def withheld_entry(key: ReleaseKey, source_ends: dict[str, int], run_key: str) -> ReleaseEntry:
    """The ledger entry of a window the crowd threshold withheld: sealed, never published, its reports late."""
    return ReleaseEntry(key=key, release_id=release_id_of(key.spec_id, key.crowd_id, key.window_end_ms),
                        digest="withheld", n_sets=0, n_messages=0, batches=0, source_ends=source_ends,
                        run_key=run_key, sealed_at_ms=int(time.time() * 1000), status=WITHHELD)


def release_key(parts: Sequence[PartHeader | ReleasePart]) -> ReleaseKey:
    """The (spec, crowd, window end) of a release, from its parts or their headers."""
    return ReleaseKey(parts[0].spec_id, parts[0].crowd_id, parts[0].window_end_ms)


def is_withheld(parts: Sequence[PartHeader | ReleasePart]) -> bool:
    """Whether the crowd threshold withheld a release (no part has a set), from its parts or their headers."""
    return sum(p.n_sets for p in parts) == 0


def seal_written(target: ReleaseTarget, ledger: ReleaseLedger, written: ReleaseFile, source_ends: dict[str, int],
                 run_key: str, extra: dict[str, Any] | None = None) -> bool:
    """One release written to its durable file (not withheld): ledger seal -> publish -> mark published.

    False when the window was already sealed with another digest (by an earlier or a racing run): this
    release is discarded and the sealed one stays, at most one release per window ever.
    """
    key = written.key
    stored = ledger.get(key)
    if stored is not None and stored.digest != written.digest:
        written.discard()  # never overwrite the file of what was released (or withheld) before
        LOG.error("window %s of %s crowd %s was already sealed by run %s; this run's release is discarded",
                  key.window_end_ms, key.spec_id, key.crowd_id, stored.run_key)
        return False
    written.commit()
    entry = ReleaseEntry(key=key, release_id=written.release_id, digest=written.digest, n_sets=written.n_sets,
                         n_messages=written.n_messages, batches=written.batches, source_ends=source_ends,
                         run_key=run_key, sealed_at_ms=int(time.time() * 1000), extra=dict(extra or {}))
    stored, created = ledger.seal(entry)
    if not created and stored.digest != written.digest:
        LOG.error("window %s of %s crowd %s was already released by run %s; this run's release is discarded",
                  key.window_end_ms, key.spec_id, key.crowd_id, stored.run_key)
        return False
    crash_point("shuffle:after_seal")
    if stored.status != "published":
        publish(target, written.release_id, written.path)
        crash_point("shuffle:after_publish")
        ledger.mark_published(key)
    return True


def seal_and_publish(target: ReleaseTarget, specs: Sequence[AnalysisSpec], staging: Location,
                     source_ends: dict[str, int], run_key: str, ledger: ReleaseLedger,
                     counts: dict[str, int] | None = None) -> tuple[int, int]:
    """The release step, one staged release at a time (``seal_written``). Withheld windows are sealed
    together at the end (one durable batch). Each part's messages are read by ``write_release`` alone (see
    there how often); grouping and withholding use the parts' staged headers. A spec with a blanket gets
    its dummies in each release (never in a withheld one); ``counts["dummies"]`` adds those released."""
    released, conflicts = 0, 0
    blankets = Blankets(target, specs)
    withheld: list[ReleaseEntry] = []
    signer: tuple | None = None
    for parts in staged_releases(staging):
        if parts.withheld:  # withheld by the crowd threshold: sealed as such, never published
            withheld.append(withheld_entry(parts.key, source_ends, run_key))
            continue
        signer = signer or load_shuffler_signer(target.keys)
        written = blankets.write(parts, *signer)
        del parts  # the release is in its file: hold one release's messages at a time, never two
        if seal_written(target, ledger, written, source_ends, run_key):
            released += 1
            if counts is not None:
                counts["dummies"] = counts.get("dummies", 0) + written.dummies
        else:
            conflicts += 1
    # A window another attempt sealed stays as it was sealed; this attempt's "withheld" is then not recorded.
    ledger.seal_many(withheld)
    return released, conflicts
