"""The shuffler's device registry: caught up from the devices topic into ``STATE/registry/devices.sqlite``.

When an enrolment counts: the shuffler's driver catches the store up (``catch_up``) at the start of every
bounded run, after the run has planned its read of the reports topic and before any worker verifies a set,
and nothing writes the store while the run's pipeline runs. So every set a run reads is verified against one
registry: the devices topic up to its end when the run started. An enrolment acknowledged after that counts
from the next run, so from the next windows the shuffler releases; it never changes a window a run has
already planned (the sets of an unknown device are dead-lettered "unknown device", as before). Catching up
after the plan is deliberate: a device that enrols, then reports, has its enrolment in the topic before its
report, hence before the plan, hence in the registry of the run that reads the report.

The streaming shuffler (``--kafka_io sdf``) catches up when it starts and every ``STREAM_CATCH_UP_S`` in its
driver; its workers see each catch-up at once, so there an enrolment counts for the sets read after the
catch-up that brought it (windows already fired are not re-verified).

Offsets are kept in the store, in the transaction of the rows they cover (``DeviceStore.apply``); a record that
is not an enrolment goes to the shuffler's dead letters (stage ``registry``) with the reason, and the
catch-up goes on. The legacy Parquet registry (``KEYS/registry/devices.parquet``) is imported once per version
of the file: the migration path, and how devices enrolled the old way keep working.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.job_config import JobConfig
from transforms.io.dead_letters import record_dead_letter
from transforms.io.kafka.clients import KafkaRecord
from transforms.io.kafka.devices import devices_topic_exists, read_devices
from transforms.state.dead_letters import DeadLetterStore
from transforms.trust.device_store import DeviceStore
from transforms.trust.devices import DeviceRegistry
from transforms.trust.enrolment import EnrolmentRecordError, decode_enrolment

LOG = logging.getLogger("esa.registry")
STAGE = "registry"
STORE_NAME = Path("registry") / "devices.sqlite"
STREAM_CATCH_UP_S = 30.0
_IMPORT_BATCH = 100_000
_PROGRESS_RECORDS = 1_000_000
_APPLY_RECORDS = 100_000  # changes per store transaction in a catch-up (~10 MB of Python objects)


def store_path(state_dir: Path) -> Path:
    """Where the shuffler keeps its device store: in its own state directory (shuffler domain)."""
    return Path(state_dir) / STORE_NAME


@dataclass
class CatchUp:
    """What one catch-up did (logged, and in the run summary)."""
    read: int = 0
    changed: int = 0  # devices added minus revoked
    dead_lettered: int = 0
    imported: int | None = None  # devices added from the legacy Parquet file, if it was imported now
    devices: int = 0
    seconds: float = 0.0
    dead_letters: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"read": self.read, "changed": self.changed, "dead_lettered": self.dead_lettered,
                "imported": self.imported, "devices": self.devices, "seconds": round(self.seconds, 3)}


def catch_up(state_dir: Path, *, bootstrap: str, topic: str | None, legacy_registry: Path | None,
             kafka_config: dict[str, Any] | None = None, client: str = "confluent") -> CatchUp:
    """Bring the store in ``state_dir`` up to the devices topic's end (and the legacy file); see the module doc.
    The caller holds the state directory's lock: the store has one writer."""
    started = time.perf_counter()
    out = CatchUp()
    with DeviceStore(store_path(state_dir)) as store:
        if legacy_registry is not None:
            out.imported = import_legacy(store, legacy_registry)
        if topic:
            if devices_topic_exists(bootstrap, topic, client_config=kafka_config, client=client):
                _read_topic(store, state_dir, out, bootstrap, topic, kafka_config or {}, client)
            else:
                LOG.info("no devices topic %r on %s yet: no enrolment to read", topic, bootstrap)
        out.devices = len(store)
    out.seconds = time.perf_counter() - started
    if out.read or out.imported:
        LOG.info("device registry caught up: %s", out.as_dict())
    return out


def _read_topic(store: DeviceStore, state_dir: Path, out: CatchUp, bootstrap: str, topic: str,
                kafka_config: dict[str, Any], client: str) -> None:
    plan, batches = read_devices(bootstrap, topic, store.offsets(topic), consumer_config=kafka_config,
                                 client=client)
    letters_dir = DeadLetterStore(Path(state_dir) / "dead_letters")
    shown = 0
    changes: list[tuple[str, bytes | None]] = []
    offsets: dict[int, int] = {}
    for batch in batches:
        letters: list[dict[str, Any]] = []
        for record in batch:
            try:
                changes.append(decode_enrolment(record.key, record.value))
            except EnrolmentRecordError as err:
                letters.append(record_dead_letter(STAGE, f"enrolment: {err}", record))
        if letters:  # before the offsets move past them: a crash in between writes the same file again
            path = letters_dir.write_run(_letters_key(batch), letters)
            out.dead_letters.append(str(path))
            LOG.warning("%d devices-topic record(s) dead-lettered to %s, first: %s", len(letters), path,
                        letters[0]["reason"])
        for partition, nxt in _next_offsets(batch).items():
            offsets[partition] = max(offsets.get(partition, 0), nxt)
        out.read += len(batch)
        out.dead_lettered += len(letters)
        if len(changes) >= _APPLY_RECORDS:
            out.changed += _apply_sorted(store, changes, topic, offsets)
            changes, offsets = [], {}
        if out.read - shown >= _PROGRESS_RECORDS:
            shown = out.read
            LOG.info("device registry: %d devices-topic records read", out.read)
    if changes or offsets:
        out.changed += _apply_sorted(store, changes, topic, offsets)
    # the ends as planned: past trailing offsets that hold no record (compacted away, transaction markers)
    store.apply((), topic=topic, offsets={r.partition: r.stop for r in plan if r.stop > r.start})


def _apply_sorted(store: DeviceStore, changes: list[tuple[str, bytes | None]], topic: str,
                  offsets: dict[int, int]) -> int:
    """Apply many batches' changes in one transaction, in device-id order: the B-tree's pages are then
    written in one sweep, each once per transaction, instead of one random page per enrolment (at 10^6
    devices: 91,000 enrolments per CPU-second instead of 68,000, and the benchmark wrote 0.9 GB instead of 3.4 GB
    for a 63 MiB store; docs/performance.md). The sort is stable, so the changes of one device keep their topic
    order, and the changes of different devices commute."""
    changes.sort(key=_device_of)
    return store.apply(changes, topic=topic, offsets=offsets)


def _device_of(change: tuple[str, bytes | None]) -> str:
    return change[0]


def _next_offsets(batch: list[KafkaRecord]) -> dict[int, int]:
    nxt: dict[int, int] = {}
    for record in batch:
        nxt[record.partition] = max(nxt.get(record.partition, 0), record.offset + 1)
    return nxt


def _letters_key(batch: list[KafkaRecord]) -> str:
    """A dead-letter file name fixed by the batch's records, so a re-read after a crash replaces it."""
    where = ",".join(f"{r.topic}/{r.partition}/{r.offset}" for r in (batch[0], batch[-1]))
    return f"registry-{hashlib.sha256(where.encode()).hexdigest()[:24]}"


def import_legacy(store: DeviceStore, path: Path) -> int | None:
    """Import the Parquet registry at ``path`` once per version of the file (size and modification time);
    returns the devices added, or None if there was nothing new to import. The file is checked as
    ``DeviceRegistry.load`` checks it (every id the hash of its key) and its devices added in batches. A device
    revoked on the topic comes back only if the file changes again: once migrated, delete the file."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    stamp = f"{st.st_size}:{st.st_mtime_ns}"
    if store.meta("legacy_import") == stamp:
        return None
    registry = DeviceRegistry.load(Path(path))
    added = 0
    ids, keys = registry.raw_rows()
    for start in range(0, len(ids), _IMPORT_BATCH):
        added += store.add_raw(ids[start:start + _IMPORT_BATCH], keys[start:start + _IMPORT_BATCH])
    store.apply((), meta={"legacy_import": stamp})
    if len(registry):
        LOG.info("imported %d enrolled devices from the legacy registry %s (%d new)", len(registry), path, added)
    return added


def catch_up_job(config: JobConfig) -> CatchUp:
    """``catch_up`` of a shuffle job's store, from its ``--devices_topic`` and its keys directory's legacy file."""
    return catch_up(config.state, bootstrap=config.bootstrap, topic=config.devices_topic,
                    legacy_registry=config.keys_layout.device_registry, kafka_config=config.kafka_config,
                    client=config.kafka_client)
