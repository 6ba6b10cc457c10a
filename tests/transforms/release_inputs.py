"""Inputs of the shuffler and analyzer stage tests, built with the real trust library.

A ``Devices`` object owns a fresh keys directory with enrolled simulated devices; it builds signed
``MessageSet``s whose payloads are sealed to the analyzer (as a device does), wraps them in
``KafkaRecord``s, runs ``IngressFn`` + ``Shuffle`` on the FnApiRunner, and numbers and signs the released
parts into ``ReleaseBatch`` records
like the shuffler's driver does (``transforms.shuffler.release_files.write_release``).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam

from pipelines.enrolment import enrol_simulated, registry_path
from tests.beam_harness import PipelineRun, run_pipeline
from transforms.device.wire import ShufflerKey
from transforms.io.kafka.bounded import KafkaRecord
from transforms.mechanisms.randomness import job_key_from_seed
from transforms.shuffler.elements import DEAD, DEDUPE_BUCKETS, TIMES, TimePolicy
from transforms.shuffler.graph import ReleasePart, Shuffle, WindowClock
from transforms.shuffler.ingress import IngressFn
from transforms.spec import AnalysisSpec, spec_from_dict
from transforms.state.prior_runs import PriorRuns
from transforms.trust.devices import SimulatedFleet
from transforms.trust.envelope import open_envelope, seal_envelope
from transforms.trust.keys import (
    load_analyzer_public,
    load_shuffler_sealing_private,
    load_shuffler_sealing_public,
    load_shuffler_signer,
)
from transforms.trust.message_set import (
    MessageSet,
    SealedMessage,
    decode_message_set,
    encode_message_set,
    sign_message_set,
)
from transforms.trust.release import ReleaseBatch, encode_release_batch, release_id_of, sign_release_batch
from transforms.trust.sealing import associated_data, seal
from transforms.wire.avro_payload import encode_payload
from transforms.wire.rows import row_channel

WINDOW_MS = 3_600_000
NOW_MS = 1_800_000 * WINDOW_MS  # the pinned clock of every run: event times must be within max_age of it
WIN_A = NOW_MS - 10 * WINDOW_MS  # window starts, closed under any watermark near NOW_MS with lateness 0
WIN_B = WIN_A + WINDOW_MS
DAY_MS = 86_400_000
TIMES_POLICY = TimePolicy(NOW_MS, 30 * DAY_MS, 3_600_000)
TOPIC = "reports"
KEY = job_key_from_seed(7)  # the shuffler's PRF key in these tests


def make_spec(mechanism: str = "grr", *, size: int = 8, subkeys: int = 4, quota: int = 1, min_clients: int = 10,
              crowd_epsilon: float = 1.0, crowd_delta: float = 1e-6, partition: str | None = None,
              publish: bool = False, lateness_s: int = 0, name: str = "stage_test", **mechanism_params: Any
              ) -> AnalysisSpec:
    crowd: dict[str, Any] = {"epsilon": crowd_epsilon, "delta": crowd_delta, "subkeys": subkeys,
                             "min_clients": min_clients, "publish_deletions": publish}
    if partition:
        crowd["partition"] = partition
    return spec_from_dict({
        "analysis": {"name": name},
        "domain": {"size": size},
        "mechanism": {"name": mechanism, "epsilon": 1.0, **mechanism_params},
        "window": {"size_seconds": WINDOW_MS // 1000, "allowed_lateness_seconds": lateness_s},
        "crowd": crowd,
        "clients": {"max_reports_per_window": quota},
    })


def drain_clock() -> WindowClock:
    return WindowClock(NOW_MS, 600_000, 300_000, drain=True)


@dataclass
class Devices:
    """Enrolled simulated devices (client ids ``c0..c{n-1}``) and the records they send."""

    keys_dir: Path
    clients: list[str]
    offsets: dict[int, itertools.count] = field(default_factory=dict)

    @classmethod
    def enrol(cls, keys_dir: Path, n: int, prefix: str = "c") -> Devices:
        clients = [f"{prefix}{i}" for i in range(n)]
        enrol_simulated(keys_dir, clients)
        return cls(keys_dir, clients)

    def __post_init__(self) -> None:
        self.fleet = SimulatedFleet.from_keys_dir(self.keys_dir)
        self.analyzer_id, self.analyzer_public = load_analyzer_public(self.keys_dir)
        self.shuffler_sealing = ShufflerKey(*load_shuffler_sealing_public(self.keys_dir))
        self.shuffler_private = load_shuffler_sealing_private(self.keys_dir)
        _SHUFFLER_KEYS.update(self.shuffler_private)

    def envelope(self, encoded_set: bytes) -> bytes:
        """What a device sends: the encoded set sealed whole to the shuffler."""
        return seal_envelope(self.shuffler_sealing.public, self.shuffler_sealing.key_id, encoded_set)

    def peel(self, value: bytes) -> bytes:
        """The shuffler's first step: the encoded set inside a record's value."""
        return open_envelope(self.shuffler_private, value)

    @property
    def registry(self) -> str:
        return str(registry_path(self.keys_dir))

    def device_id(self, client: str) -> str:
        return self.fleet.device_id(client)

    def sealed_messages(self, spec: AnalysisSpec, rows: Sequence[tuple], crowd: str | None, event_time_ms: int,
                        channels: Sequence[int] | None = None) -> tuple[SealedMessage, ...]:
        end = (event_time_ms // (spec.window_seconds * 1000) + 1) * spec.window_seconds * 1000
        out = []
        for i, row in enumerate(rows):
            channel = row_channel(spec.randomizer, row) if channels is None else channels[i]
            ad = associated_data(spec.spec_id, crowd, end, channel)
            out.append(SealedMessage(channel, seal(self.analyzer_public, self.analyzer_id,
                                                   encode_payload(spec.randomizer, row), ad)))
        return tuple(out)

    def message_set(self, spec: AnalysisSpec, client: str, event_time_ms: int, rows: Sequence[tuple], *,
                    crowd: str | None = None, channels: Sequence[int] | None = None, nonce: bytes | None = None,
                    spec_id: str | None = None) -> bytes:
        messages = self.sealed_messages(spec, rows, crowd, event_time_ms, channels)
        ms = MessageSet(spec_id or spec.spec_id, crowd, self.device_id(client), event_time_ms,
                        nonce or secrets.token_bytes(16), self.analyzer_id, messages)
        return self.envelope(encode_message_set(sign_message_set(ms, self.fleet.signing_key(client))))

    def record(self, value: bytes, partition: int = 0, offset: int | None = None) -> KafkaRecord:
        counter = self.offsets.setdefault(partition, itertools.count())
        offset = next(counter) if offset is None else offset
        return KafkaRecord(TOPIC, partition, offset, NOW_MS, None, value)

    def crowd(self, spec: AnalysisSpec, clients: Iterable[str], window_start: int, value: int | None = None, *,
              crowd: str | None = None, partition: int = 0) -> list[KafkaRecord]:
        """One single-message set per client, event times spread over the window, value = index mod d."""
        out = []
        for i, client in enumerate(clients):
            row = (i % spec.d if value is None else value,)
            t = window_start + (i * 7919) % (spec.window_seconds * 1000)
            out.append(self.record(self.message_set(spec, client, t, [row], crowd=crowd), partition))
        return out


_SHUFFLER_KEYS: dict = {}  # every Devices' shuffler sealing keys (random ids): ``decode_set`` opens any of them


def decode_set(value: bytes) -> MessageSet:
    """The MessageSet inside a value some ``Devices`` made (the outer layer peeled, as the shuffler does)."""
    return decode_message_set(open_envelope(_SHUFFLER_KEYS, value))


def ingress_fn(specs: Sequence[AnalysisSpec], devices: Devices, prior: PriorRuns | None = None,
               times: TimePolicy = TIMES_POLICY) -> IngressFn:
    fn = IngressFn(list(specs), devices.registry, prior or PriorRuns(), times, keys_dir=str(devices.keys_dir))
    fn.setup()
    return fn


def shuffle_run(tmp_path: Path, specs: Sequence[AnalysisSpec], devices: Devices, records: list[KafkaRecord], *,
                key: bytes = KEY, clock: WindowClock | None = None, prior: PriorRuns | None = None,
                times: TimePolicy = TIMES_POLICY, batch: int = 25, spill: Path | None = None,
                spill_bytes: int | None = None, buckets: int = DEDUPE_BUCKETS) -> PipelineRun:
    """IngressFn + Shuffle as ``pipelines.shuffle.build`` wires them; outputs released, held, dead, times.

    ``spill``: the sets and units go through files there (as the shuffle job runs), not through Beam."""
    batches = [records[i:i + batch] for i in range(0, len(records), batch)]

    def build(p: beam.Pipeline) -> dict[str, beam.PCollection]:
        ingress = (p | beam.Create(batches, reshuffle=False)
                   | beam.ParDo(IngressFn(list(specs), devices.registry, prior or PriorRuns(), times, buckets=buckets,
                                          spill=spill, spill_bytes=spill_bytes, keys_dir=str(devices.keys_dir)))
                   .with_outputs(DEAD, TIMES, main="sets"))
        released, held, dead, run_times = (ingress.sets, ingress[TIMES]) | Shuffle(specs, key, clock or drain_clock(),
                                                                                   spill=spill)
        return {"released": released, "held": held, "dead": (ingress[DEAD], dead) | beam.Flatten(),
                "times": run_times}

    return run_pipeline(tmp_path, build)


def sign_release(keys_dir: Path, parts: Iterable[ReleasePart], per_batch: int = 1_000_000) -> dict[str, list[bytes]]:
    """Released parts -> per release id, its signed encoded batches (as the driver assembles them)."""
    key_id, signer = load_shuffler_signer(keys_dir)
    by_release: dict[tuple, list[ReleasePart]] = {}
    for part in parts:
        by_release.setdefault((part.spec_id, part.crowd_id, part.window_end_ms), []).append(part)
    out = {}
    for (spec_id, crowd, end), mine in by_release.items():
        mine.sort(key=lambda p: p.subkey)
        messages = [SealedMessage(c, s) for p in mine for c, s in p.messages]
        n_sets = sum(p.n_sets for p in mine)
        deleted = None if any(p.deleted is None for p in mine) else sum(p.deleted for p in mine)
        chunks = [messages[i:i + per_batch] for i in range(0, len(messages), per_batch)] or [[]]
        rid = release_id_of(spec_id, crowd, end)
        out[rid] = [encode_release_batch(sign_release_batch(
            ReleaseBatch(rid, spec_id, crowd, end, i, len(chunks), n_sets, len(messages), deleted, tuple(chunk)),
            key_id, signer)) for i, chunk in enumerate(chunks)]
    return out


def open_and_assemble(specs: Sequence[AnalysisSpec], keys_dir: Path,
                      keyed: Iterable[tuple[str, Any]]) -> tuple[list[Any], dict[str, list[Any]]]:
    """``DecodeReleaseFn``'s (release id, BatchElement) outputs -> ``AssembleReleaseFn``'s outputs (main, tagged),
    through ``OpenBatchFn`` and a grouping by release id, as the analyze job runs them."""
    from transforms.analyzer.releases import AssembleReleaseFn, OpenBatchFn

    opener, assembler = OpenBatchFn(specs, str(keys_dir)), AssembleReleaseFn(specs)
    opener.setup()
    groups: dict[str, list[Any]] = {}
    for element in keyed:
        for release_id, opened in opener.process(element):
            groups.setdefault(release_id, []).append(opened)
    return split_outputs(out for group in groups.items() for out in assembler.process(group))


def split_outputs(outputs: Iterable[Any]) -> tuple[list[Any], dict[str, list[Any]]]:
    """A DoFn's outputs -> (main outputs, tagged outputs by tag)."""
    main: list[Any] = []
    tagged: dict[str, list[Any]] = {}
    for out in outputs:
        if isinstance(out, beam.pvalue.TaggedOutput):
            tagged.setdefault(out.tag, []).append(out.value)
        else:
            main.append(out)
    return main, tagged
