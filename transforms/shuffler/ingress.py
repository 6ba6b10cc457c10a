"""Shuffler ingress: Kafka records of signed message sets -> authenticated sets keyed by crowd and window.

The first thing the shuffler does with a record, before it is allowed to influence anything:

0. open the outer layer: every set arrives sealed whole to the shuffler (``transforms.trust.envelope``,
   nested encryption), so the reports topic never holds the analyzer-sealed blobs a release carries; a bare
   set is refused, since whoever sent it exposed its blobs to every reader of the reports topic;
1. decode the ``MessageSet`` (every field range-checked by ``transforms.trust.message_set``);
2. check it belongs to a spec this shuffler serves and to a crowd the spec allows;
3. refuse event times outside ``[now - max_age, now + max_skew]`` (like DAP's report expiry and clock
   skew): a forged far-future time would otherwise advance the watermark and close windows early;
4. verify the device's Ed25519 signature against the enrolment registry (the crowd threshold therefore
   counts authenticated devices; a fabricated device id never reaches a crowd);
5. place it: a window already in the release ledger either contains it (its offset is below the read
   that sealed the release: a re-read, skipped) or it is late (dead-lettered, never released again).

Admitted sets leave packed per (spec, crowd, window, dedupe bucket) (``transforms.shuffler.packed_sets``): pickled
``PackedSets`` per input batch, or, given a spill location, ``SpillRef``s to files holding a bundle's sets
(``transforms.shuffler.spill``), so that the group-by-key behind carries references, not the sets.

Records a previous run already dead-lettered (offset below that run's end) are skipped, not dead-lettered
twice. Payloads stay sealed: the shuffler never holds the analyzer's key. Every outcome is a counter, so a
run balances: read = dead-lettered + re-read + held + deleted + duplicate + released (in message sets).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import pickle
import time
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindows

from schemas import WireFormatError
from transforms.io.dead_letters import record_dead_letter
from transforms.io.kafka.bounded import KafkaRecord
from transforms.io.staging import Location
from transforms.mechanisms.base import channel_count, is_single_message
from transforms.runtime.parallel import map_ordered
from transforms.runtime.worker_gc import tune_worker_gc
from transforms.shuffler.elements import (
    DEAD,
    DEDUPE_BUCKETS,
    NAMESPACE,
    TIMES,
    VERIFIED,
    SetElement,
    TimePolicy,
    device_bucket,
    window_end_of,
)
from transforms.shuffler.packed_sets import PackedSets
from transforms.shuffler.spill import SpillBuffer
from transforms.spec import AnalysisSpec, SpecSet
from transforms.state.prior_runs import PriorRuns, partition_key
from transforms.trust.device_store import DeviceStore
from transforms.trust.devices import DeviceRegistry
from transforms.trust.ed25519 import verify_detached
from transforms.trust.envelope import SealError, open_envelopes
from transforms.trust.files import KeyFileError
from transforms.trust.keys import load_analyzer_publics, load_shuffler_sealing_private
from transforms.trust.message_set import AuthError, decode_message_set, decode_signed_set, signed_parts
from transforms.trust.sealing import key_id_of
from transforms.wire.elements import SourceRef
from transforms.wire.rows import PRESENCE

LOG = logging.getLogger(__name__)


def channel_problem(spec: AnalysisSpec, messages: Sequence[tuple[int, bytes]]) -> str | None:
    """Channels a mechanism cannot have (contents are sealed: only the routing is checked here)."""
    mechanism = spec.randomizer
    if is_single_message(mechanism):
        if len(messages) != 1 or messages[0][0] != 0:
            return f"{mechanism.name} sends exactly one message on channel 0"
        return None
    channels = channel_count(mechanism)
    bad = [c for c, _ in messages if c != PRESENCE and not 0 <= c < channels]
    if bad:
        return f"channel {bad[0]} does not exist for {mechanism.name} (channels 0..{channels - 1})"
    return None


# IngressFn._stage: a set, its signature check, and the digest of (signed bytes, signature) it is remembered by
_Stage = tuple["SetElement", "tuple[bytes, bytes] | str | None", bytes]
_SIGNED_TAG = b"esa-signed-set-v1"
_KEY_RELOAD_S = 10.0  # at most this often, an envelope sealed to a key id not loaded yet reloads the keys

_REGISTRIES: dict[str, tuple[tuple[int, int, int] | None, Any]] = {}


def shared_registry(path: str) -> Any:
    """The device registry at ``path``, loaded once per process while the file is unchanged: a runner may
    set up several ``IngressFn`` instances in one worker, and each copy costs ~56 bytes per enrolled device.

    A ``.sqlite`` path is the shuffler's device store (``transforms.trust.device_store``), opened read-only
    once per process: it sees each catch-up of the driver as it commits, in bounded memory."""
    if path.endswith(".sqlite"):
        cached = _REGISTRIES.get(path)
        if cached is None:
            _REGISTRIES.clear()
            cached = _REGISTRIES[path] = (None, DeviceStore(path, readonly=True))
        return cached[1]
    try:
        st = os.stat(path)
        stamp: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        stamp = None
    cached = _REGISTRIES.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    registry = DeviceRegistry.load(path)
    _REGISTRIES.clear()  # keep one: a long-running job must not collect every version it has seen
    _REGISTRIES[path] = (stamp, registry)
    return registry


class IngressFn(beam.DoFn):
    """Batches of KafkaRecords -> ((spec, crowd, window_end, bucket), packed sets) + dead letters.

    The packed sets are a pickled ``PackedSets`` per input batch and key, or, with ``spill`` (a directory
    or URL), a ``SpillRef`` per key and spilled file (``transforms.shuffler.spill``: a bundle's sets are buffered and
    written in files of ``spill_bytes``). Also emits, on ``TIMES``, (partition key, max authenticated event
    time) per input batch: the watermark is computed from authenticated, in-range records only, read for
    the first time.
    """
    def __init__(self, specs: Sequence[AnalysisSpec], registry_path: str, prior: PriorRuns, times: TimePolicy,
                 threads: int = 0, buckets: int = DEDUPE_BUCKETS, *, keys_dir: str, spill: Location | None = None,
                 spill_bytes: int | None = None, python_gc: str = "tuned"):
        self._keys_dir = str(keys_dir)  # the shuffler's sealing keys (``shuffler/<id>.x25519``): the outer layer
        self._sealing: Any = None
        self._sealing_loaded = 0.0
        self._specs = SpecSet(specs)
        # Per-set look-ups of the hot path, answered from plain containers (a Mapping's get and a spec's properties
        # cost ~0.3 microseconds a set together): the specs by id, those whose sets are checked for analyzer key ids,
        # and the event times ``TimePolicy`` accepts at the run's clock (others, and any other policy, ask it).
        self._by_id = dict(self._specs.items())
        self._blanket = frozenset(s.spec_id for s in self._specs.values() if s.crowd.blanket)
        self._in_time = (times.now_ms - times.max_age_ms, times.now_ms + times.max_skew_ms) \
            if type(times) is TimePolicy else (1, 0)
        self._python_gc = python_gc  # transforms.runtime.worker_gc
        self._spill, self._spill_bytes = (str(spill) if spill else None), spill_bytes
        self._buffer: SpillBuffer | None = None
        self._buckets = buckets  # dedupe groups per (crowd, window): transforms.shuffler.graph.ScaleOut
        self._registry_path, self._prior, self._times = registry_path, prior, times
        self._threads = threads  # signature checks of a batch run on this many threads (0: one per core)
        self._registry: Any = None
        self._single: dict[str, bool] = {}  # spec_id -> single-message mechanism? (filled on first use)
        self._dead = Metrics.counter(NAMESPACE, "dead_lettered")
        self._reread = Metrics.counter(NAMESPACE, "records_reread")
        self._late = Metrics.counter(NAMESPACE, "sets_late")
        self._accepted = Metrics.counter(NAMESPACE, "sets_authenticated")
        self._skipped = Metrics.counter(NAMESPACE, "signatures_verified_before")

    def setup(self) -> None:
        tune_worker_gc(self._python_gc)
        self._registry = shared_registry(self._registry_path)
        self._load_sealing_keys()
        self._analyzer_ids: frozenset[str] = frozenset()
        self._analyzer_ids_loaded = -math.inf

    def _load_sealing_keys(self) -> None:
        self._sealing = load_shuffler_sealing_private(self._keys_dir)
        self._sealing_loaded = time.monotonic()

    def _analyzer_key_problem(self, spec: AnalysisSpec, messages: tuple[tuple[int, bytes], ...]) -> str | None:
        """Why a blanket spec's set cannot be released: a message sealed to an analyzer key id with no public
        key here. The shuffler seals its dummies to the key ids of the real messages beside them, so an unknown
        id would stop the whole release; the set is dead-lettered instead (reloading the public keys at most
        every ``_KEY_RELOAD_S``, so a key distributed after the job started is picked up)."""
        if not spec.crowd.blanket:
            return None
        try:
            ids = {key_id_of(blob) for _, blob in messages}
        except SealError as err:
            return f"sealed payload: {err}"
        unknown = ids - self._analyzer_ids
        if unknown and time.monotonic() - self._analyzer_ids_loaded > _KEY_RELOAD_S:
            self._load_analyzer_ids()
            unknown = ids - self._analyzer_ids
        if unknown:
            return f"sealed to analyzer key id {sorted(unknown)[0]!r}, which has no public key at the shuffler"
        return None

    def _load_analyzer_ids(self) -> None:
        try:
            self._analyzer_ids = frozenset(load_analyzer_publics(self._keys_dir))
        except KeyFileError as err:  # no public analyzer key at all: every blanket set waits in dead letters
            LOG.error("analyzer public keys: %s", err)
            self._analyzer_ids = frozenset()
        self._analyzer_ids_loaded = time.monotonic()

    def _open(self, records: Sequence[KafkaRecord]) -> list[bytes | str | None]:
        """Each record's encoded set (the outer layer peeled), the reason it does not open, or None if empty.

        A key id this worker has not loaded reloads the keys (at most every ``_KEY_RELOAD_S``): a rotated
        sealing key reaches devices only after its private file exists, so a running job picks it up."""
        if self._sealing is None:
            self._load_sealing_keys()
        present = [i for i, r in enumerate(records) if r.value is not None]
        blobs = [records[i].value for i in present]
        opened = open_envelopes(self._sealing, blobs, self._threads)
        unknown = [k for k, o in enumerate(opened) if isinstance(o, SealError) and str(o).startswith("unknown key")]
        if unknown and time.monotonic() - self._sealing_loaded > _KEY_RELOAD_S:
            self._load_sealing_keys()
            for k, again in zip(unknown, open_envelopes(self._sealing, [blobs[k] for k in unknown], self._threads),
                                strict=True):
                opened[k] = again
        out: list[bytes | str | None] = [None] * len(records)
        for i, o in zip(present, opened, strict=True):
            out[i] = f"not sealed to the shuffler: {o}" if isinstance(o, SealError) else o
        return out

    def start_bundle(self) -> None:
        if self._spill:
            extra = {"max_bytes": self._spill_bytes} if self._spill_bytes else {}
            self._buffer = SpillBuffer(self._spill, PackedSets.concat, lambda p: p.nbytes, **extra)

    def finish_bundle(self) -> Iterator[Any]:
        if self._buffer is not None:
            for kv in self._buffer.flush():
                yield GlobalWindows.windowed_value(kv)

    def process(self, element: KafkaRecord | list[KafkaRecord]) -> Iterator[Any]:
        groups: dict[tuple[str, str | None, int, int], list[SetElement]] = {}
        latest: dict[str, int] = {}
        records = element if isinstance(element, list) else [element]
        pkeys = _partition_keys(records)
        checked: dict[str, list[tuple[int, bytes]]] = {}  # signatures verified in this call, by partition
        dead: list[TaggedOutput] = []
        reread = late = accepted = skipped = 0  # counted here, added once: a counter's inc is not free
        prior, buckets = self._prior, self._buckets
        admitted, verified, remembered = self._admit_batch(records, pkeys)
        for row, (record, pkey, item) in enumerate(zip(records, pkeys, admitted, strict=True)):
            seen_before = record.offset < prior.processed_until.get(pkey, 0)
            if type(item) is str:
                if seen_before:
                    reread += 1  # dead-lettered by the run that first read it
                else:
                    dead.append(TaggedOutput(DEAD, record_dead_letter("ingress", item, record)))
                continue
            assert isinstance(item, SetElement)
            if row in verified:
                checked.setdefault(pkey, []).append((record.offset, remembered[row]))
            else:
                skipped += 1  # verified by an earlier run
            window = (item.spec_id, item.crowd_id, item.window_end_ms)
            if prior.released and prior.replayed(window, pkey, record.offset):
                released = prior.released[window]
                if record.offset < released.get(pkey, 0) or seen_before:
                    reread += 1  # part of that release, or already dead-lettered as late
                else:
                    late += 1
                    dead.append(TaggedOutput(DEAD, record_dead_letter(
                        "ingress", "late: its window was already released", record)))
                continue
            accepted += 1
            if not seen_before:
                # Only new records are news for the watermark: a held set re-read by every run must not keep
                # its partition active forever (the last window of a stream that goes quiet would never
                # close); its event time is already in the run state of the run that first read it.
                latest[pkey] = max(latest.get(pkey, item.event_time_ms), item.event_time_ms)
            key = (item.spec_id, item.crowd_id, item.window_end_ms, device_bucket(item.device_id, buckets))
            groups.setdefault(key, []).append(item)
        for counter, n in ((self._dead, len(dead)), (self._reread, reread), (self._late, late),
                           (self._accepted, accepted), (self._skipped, skipped)):
            if n:
                counter.inc(n)
        yield from dead
        for pkey, event_ms in latest.items():
            yield TaggedOutput(TIMES, (pkey, event_ms))
        for pkey, entries in checked.items():
            # offsets as an int64 array: the driver merges every verified set of the run (a list of Python ints
            # cost 36 bytes per set there)
            yield TaggedOutput(VERIFIED, (pkey, np.fromiter((o for o, _ in entries), np.int64, len(entries)),
                                          b"".join(d for _, d in entries)))
        for key, items in groups.items():
            packed = PackedSets.of(key[0], key[1], key[2], items)
            if self._buffer is not None:
                yield from self._buffer.add(key, packed)
            else:  # pickled here: Beam's coder would otherwise pickle it through a slower generic path
                yield key, pickle.dumps(packed, protocol=pickle.HIGHEST_PROTOCOL)

    def _admit_batch(self, records: Sequence[KafkaRecord], pkeys: Sequence[str]
                     ) -> tuple[list[SetElement | str], frozenset[int], dict[int, bytes]]:
        """(each record's set or the reason it is refused, positions whose signature was checked in this call,
        the digest each checked set is remembered by), in four passes:

        1. ``_stage`` every record: open its envelope, decode and check it, everything but its device;
        2. look up every staged set's device in the registry at once (one vectorized search, not one per set);
        3. each staged set's verdict on its device, and its signature check (key, signature, signed bytes);
        4. the signature checks on the thread pool.

        Why the checks apart: a thread that returns from libsodium must win the GIL back from the one running
        Python, which costs up to a switch interval; with decoding and checks on the pool too, two threads
        ran slower than one (measured on the analyzer's equivalent: 130 against 68 microseconds per record).
        Here the pool runs nothing but ``verify_detached``.
        """
        opened = self._open(records)
        staged = [self._stage_safely(record, pkey, value)
                  for record, pkey, value in zip(records, pkeys, opened, strict=True)]
        waiting = [i for i, stage in enumerate(staged) if type(stage) is tuple]
        remembered = {i: staged[i][2] for i in waiting}
        keys = self._public_keys([staged[i][0].device_id for i in waiting])
        pending: list[int] = []
        checks: list[tuple[bytes, bytes, bytes]] = []
        for i, public_key in zip(waiting, keys, strict=True):
            item, signed, _ = staged[i]
            if public_key is None:  # a set verified before too: its device must still be enrolled
                staged[i] = "unauthenticated: unknown device (not enrolled)"
            elif signed is None:  # verified by an earlier run
                staged[i] = item
            elif isinstance(signed, str):
                staged[i] = signed
            else:
                pending.append(i)
                checks.append((public_key, *signed))
        for i, ok in zip(pending, map_ordered(_verify, checks, self._threads), strict=True):
            staged[i] = staged[i][0] if ok else "unauthenticated: bad signature"
        return staged, frozenset(pending), remembered

    def _stage_safely(self, record: KafkaRecord, pkey: str, value: bytes | str | None) -> _Stage | str:
        try:
            return self._stage(record, pkey, value)
        except Exception as err:
            LOG.exception("ingress failed on %s", pkey)
            return f"internal error on this record ({type(err).__name__})"

    def _stage(self, record: KafkaRecord, pkey: str, value: bytes | str | None) -> _Stage | str:
        """(set, what its signature check needs, digest) or the reason to refuse it: every check but its device's.

        ``value``: the record's set with the outer layer peeled (``_open``), or why it did not open.
        What the check needs: None for a set verified by an earlier run (same signed bytes and signature, same
        position), else (signature, signed bytes), or the reason it cannot have been signed (given only if its
        device is known). The set's dedupe digest covers what the device signed, never the record's bytes: a
        replay re-encoded in non-canonical Avro (an overlong varint) decodes to the same fields and the same
        digest, so it counts once.
        """
        if value is None:
            return "empty record"
        if isinstance(value, str):
            return value
        unsigned: AuthError | None = None
        fast = decode_signed_set(value)  # the usual set, without a MessageSet object; None: the reference path
        if fast is not None:
            spec_id, crowd_id, device_id, event_ms, messages, signature, signed_bytes = fast
        else:
            try:
                message_set = decode_message_set(value)
            except WireFormatError as err:
                return f"malformed message set: {err.reason}"
            spec_id, crowd_id, device_id, event_ms = (message_set.spec_id, message_set.crowd_id,
                                                      message_set.device_id, message_set.event_time_ms)
            messages = tuple([(m.channel, m.sealed) for m in message_set.messages])
            try:
                signature, signed_bytes = signed_parts(message_set)
            except AuthError as err:  # refused below, once its device is looked up (an unknown device first)
                unsigned = err
        spec = self._by_id.get(spec_id)
        if spec is None:
            return "unknown spec_id (not served by this shuffler)"
        try:
            crowd = spec.crowd_of(crowd_id)
        except ValueError as err:
            return str(err)
        if crowd != crowd_id:
            return f"crowd_id given but {spec.name} has no crowd partition"
        clock = self._prior.first_clock(pkey, record.offset) if self._prior.read_clock else None
        problem = None if clock is None and self._in_time[0] <= event_ms <= self._in_time[1] else \
            self._times.problem(event_ms, clock)
        problem = problem or self._channel_problem(spec, messages) or (
            spec_id in self._blanket and self._analyzer_key_problem(spec, messages))
        if problem:
            return problem
        signed: tuple[bytes, bytes] | str | None = None
        if unsigned is not None:
            signed = f"unauthenticated: {unsigned}"
            digest = remembered = hashlib.sha256(value).digest()
        else:
            content = hashlib.sha256(_SIGNED_TAG)
            content.update(signed_bytes)
            digest = content.digest()
            content.update(signature)
            remembered = content.digest()  # covers all the signature check reads: a match verifies the same
            if not (self._prior.verified.offsets and self._prior.verified.contains(pkey, record.offset, remembered)):
                signed = (signature, signed_bytes)
        window_end = window_end_of(event_ms, spec.window_seconds * 1000)
        return (SetElement(spec.spec_id, crowd, device_id, event_ms, window_end, digest, messages,
                           SourceRef(record.topic, record.partition, record.offset)), signed, remembered)

    def _public_keys(self, device_ids: list[str]) -> list[bytes | None]:
        """The registry's keys of a batch's devices; one id at a time if the batch lookup fails (a bug: logged)."""
        try:
            return self._registry.public_keys(device_ids)
        except Exception:
            LOG.exception("device registry: batch lookup failed, looking %d devices up one by one", len(device_ids))
            return [_public_key_or_none(self._registry, d) for d in device_ids]

    def _channel_problem(self, spec: AnalysisSpec, messages: tuple[tuple[int, bytes], ...]) -> str | None:
        """``channel_problem``, with a spec's single-message flag looked up once (the common case in two tests)."""
        single = self._single.get(spec.spec_id)
        if single is None:
            single = self._single[spec.spec_id] = is_single_message(spec.randomizer)
        if single and len(messages) == 1 and messages[0][0] == 0:
            return None
        return channel_problem(spec, messages)


def _partition_keys(records: Sequence[KafkaRecord]) -> list[str]:
    """``partition_key`` of each record, each formatted once per batch."""
    names: dict[tuple[str, int], str] = {}
    out = []
    for record in records:
        where = (record.topic, record.partition)
        name = names.get(where)
        if name is None:
            name = names[where] = partition_key(*where)
        out.append(name)
    return out


def _public_key_or_none(registry: Any, device_id: str) -> bytes | None:
    try:
        return registry.public_key(device_id)
    except Exception:  # as signature_inputs: a device that cannot be looked up is not enrolled
        return None


def _verify(check: tuple[bytes, bytes, bytes]) -> bool:
    return verify_detached(*check)
