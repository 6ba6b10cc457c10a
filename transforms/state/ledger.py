"""The release ledger: which (spec, crowd, window) has been released, once and for all.

One ledger per trust domain's state directory. Releasing a crowd's window is a two-step protocol:

1. ``seal``: create-if-absent of the window's entry (its release id, the digest of what is released, and the
   source offsets that delimit its input). Of two racing jobs or a rerun of a crashed one exactly one seals;
   the other gets the stored entry back and must release *that* (or nothing), never its own.
2. publish the release (write estimates, produce to Kafka), then ``mark_published``. A crash between the two
   leaves a sealed-but-unpublished entry: ``unpublished()`` lists them so the next run republishes them.
   Publication therefore must be idempotent (the estimates store is, by release id).

Layout: ``root/<spec part>/<window_end_ms>_<crowd part>.json``, one file per released window (see
``ReleaseKey.slug``), and ``root/<spec part>/withheld/<digest>.jsonl``: the windows one ``seal_many`` call
withheld, many per file. A withheld entry is final (never published, never rewritten), so a run that closes
20,000 windows below the crowd threshold writes (and fsyncs) one batch file instead of 20,000.

Every decision (``seal``, ``seal_many``) is taken under an exclusive ``flock`` on ``root/.seal.lock``, which
makes create-if-absent hold across both layouts: a key is sealed at most once, in one of them. The per-key
file is still published with ``create_exclusive``, so a complete file placed there by anyone wins.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transforms.state.files import StateError, atomic_write_json, create_exclusive, ensure_dir, parse_json, read_json

SEALED, PUBLISHED = "sealed", "published"
WITHHELD = "withheld"  # a window closed below the crowd threshold: nothing published, ever; its reports are late
STATUSES = (SEALED, PUBLISHED, WITHHELD)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_STEM_CHARS = 48
LOCK_NAME = ".seal.lock"  # hidden: listings skip dot-files
WITHHELD_DIR = "withheld"
BATCH_FORMAT, BATCH_VERSION = "esa-ledger-withheld", 1
LEGACY_ACCOUNT = "accounting"  # where ledgers written before typed events kept a release's accounting dict

if TYPE_CHECKING:
    from transforms.privacy.events import WindowEvent


def _safe_part(text: str) -> str:
    """A readable, filesystem-safe, collision-resistant name for ``text``: sanitized prefix + 10 hex of SHA-256.

    The hash keeps distinct texts apart after sanitizing ("a/b" and "a_b"); the prefix keeps the tree readable.
    """
    stem = _UNSAFE.sub("_", text)[:_STEM_CHARS]
    if stem.startswith("."):
        stem = "_" + stem[1:]  # never a hidden file: listings skip dot-files (temporary files)
    return f"{stem}-{hashlib.sha256(text.encode('utf-8')).hexdigest()[:10]}"


@dataclass(frozen=True)
class ReleaseKey:
    """One crowd's window of one spec: the unit that is released exactly once."""

    spec_id: str
    crowd_id: str | None
    window_end_ms: int

    def __post_init__(self) -> None:
        if not isinstance(self.spec_id, str) or not self.spec_id:
            raise ValueError(f"spec_id must be a non-empty string, got {self.spec_id!r}")
        if self.crowd_id is not None and not isinstance(self.crowd_id, str):
            raise ValueError(f"crowd_id must be a string or None, got {self.crowd_id!r}")
        if not isinstance(self.window_end_ms, int) or isinstance(self.window_end_ms, bool):
            raise ValueError(f"window_end_ms must be an int, got {self.window_end_ms!r}")

    @property
    def spec_dir(self) -> str:
        return _safe_part(self.spec_id)

    @property
    def slug(self) -> str:
        """``<spec part>/<window_end_ms>_<crowd part>``; crowd None is ``_all`` (a crowd named "_all" gets a
        hash suffix like every named crowd, so the two never collide)."""
        crowd = "_all" if self.crowd_id is None else _safe_part(self.crowd_id)
        return f"{self.spec_dir}/{self.window_end_ms}_{crowd}"

    def to_json(self) -> dict[str, Any]:
        return {"spec_id": self.spec_id, "crowd_id": self.crowd_id, "window_end_ms": self.window_end_ms}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ReleaseKey:
        return cls(spec_id=obj["spec_id"], crowd_id=obj["crowd_id"], window_end_ms=obj["window_end_ms"])


@dataclass(frozen=True)
class ReleaseEntry:
    """What was released for a key. ``source_ends`` maps "topic/partition" to the end offset (exclusive) of the
    read that sealed it: records of this window below it belong to this release, records at or above it are
    late for it. ``digest`` identifies the released content, so a rerun can check it would release the same.
    ``event``: the release's privacy cost (``transforms.privacy.events.WindowEvent``; None: withheld, or a
    release of no population). An entry written before events kept a plain dict under ``extra["accounting"]``:
    it is read as the event it described (``event_json.from_account``) and written back as one."""

    key: ReleaseKey
    release_id: str
    digest: str
    n_sets: int
    n_messages: int
    batches: int
    source_ends: dict[str, int]
    run_key: str
    sealed_at_ms: int
    status: str = SEALED
    extra: dict[str, Any] = field(default_factory=dict)
    published_at_ms: int | None = None
    event: WindowEvent | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if not isinstance(self.release_id, str) or not self.release_id:
            raise ValueError(f"release_id must be a non-empty string, got {self.release_id!r}")
        for name in ("n_sets", "n_messages", "batches", "sealed_at_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for source, end in self.source_ends.items():
            if not isinstance(source, str) or not isinstance(end, int) or isinstance(end, bool):
                raise ValueError(f"source_ends must map 'topic/partition' to an int offset, got {source!r}: {end!r}")

    @property
    def published(self) -> bool:
        return self.status == PUBLISHED

    def to_json(self) -> dict[str, Any]:
        # Built by hand: dataclasses.asdict deep-copies recursively, a third of sealing 20,000 windows.
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(key=self.key.to_json(), source_ends=dict(self.source_ends), extra=json.loads(json.dumps(self.extra)))
        if self.event is None:
            del out["event"]  # withheld entries: the form every ledger version reads
        else:
            from transforms.privacy.event_json import to_json  # numpy/scipy: only where a release has an event

            out["event"] = to_json(self.event)
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> ReleaseEntry:
        fields = dict(obj)
        fields["key"] = ReleaseKey.from_json(fields["key"])
        event, extra = fields.get("event"), fields.get("extra")
        if event is not None or (isinstance(extra, dict) and LEGACY_ACCOUNT in extra):
            from transforms.privacy import event_json

            if event is not None:
                fields["event"] = event_json.from_json(event)
            else:  # written before typed events: migrated on read
                fields["extra"] = {k: v for k, v in extra.items() if k != LEGACY_ACCOUNT}
                fields["event"] = event_json.from_account(extra[LEGACY_ACCOUNT])
        return cls(**fields)


def release_id_for(key: ReleaseKey, digest: str) -> str:
    """A deterministic release id: 16 hex of SHA-256 of the key and the content digest.

    A rerun that reproduces a release gets the same id, hence the same estimates part path, so republishing
    after a crash is a no-op; a different content digest gets a different id.
    """
    canonical = json.dumps({"digest": digest, "key": key.to_json()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class ReleaseLedger:
    """The ledger under ``root`` (a trust domain's state directory, e.g. ``state/releases``)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._batches: dict[str, dict[str, list[ReleaseEntry]]] = {}  # spec dir -> batch file -> its entries

    def path_of(self, key: ReleaseKey) -> Path:
        return self.root / f"{key.slug}.json"

    def _load(self, path: Path | str, expected: ReleaseKey | None = None) -> ReleaseEntry | None:
        obj = read_json(path)  # str paths from scandir: pathlib parsing would dominate a 20,000-entry listing
        if obj is None:
            return None
        try:
            entry = ReleaseEntry.from_json(obj)
        except (KeyError, TypeError, ValueError) as err:
            raise StateError(f"invalid ledger entry {path}: {err}") from None
        if expected is not None and entry.key != expected:
            raise StateError(f"ledger entry {path} holds {entry.key}, not {expected} (a slug hash collision)")
        return entry

    @contextlib.contextmanager
    def _deciding(self) -> Iterator[None]:
        """Exclusive right to decide what is sealed (blocking ``flock``; released by the kernel on any death).

        Opened per decision, never kept: a descriptor inherited over ``fork`` would share the lock.
        """
        ensure_dir(self.root)
        fd = os.open(self.root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _withheld(self, spec_dir: str) -> dict[ReleaseKey, ReleaseEntry]:
        """The withheld entries of one spec directory, parsing only batch files not seen before (they are
        immutable once they exist)."""
        known = self._batches.setdefault(spec_dir, {})
        for item in _scan(os.path.join(spec_dir, WITHHELD_DIR)):
            if item.name.endswith(".jsonl") and not item.name.startswith(".") and item.name not in known:
                known[item.name] = _read_batch(item.path)
        index: dict[ReleaseKey, ReleaseEntry] = {}
        for name, entries in known.items():
            for entry in entries:
                if index.setdefault(entry.key, entry) is not entry:
                    raise StateError(f"{entry.key} is sealed twice in {spec_dir}/{WITHHELD_DIR} (batch {name})")
        return index

    def get(self, key: ReleaseKey) -> ReleaseEntry | None:
        entry = self._load(self.path_of(key), key)
        if entry is None:
            return self._withheld(str(self.path_of(key).parent)).get(key)
        return entry

    def seal(self, entry: ReleaseEntry) -> tuple[ReleaseEntry, bool]:
        """Record ``entry`` unless its key is sealed already: (stored entry, whether we created it).

        When False the caller compares ``digest``: equal means a rerun reproduced the same release (publish
        the stored one if unpublished); different means the window was released with other content and
        this attempt must not release.
        """
        path = self.path_of(entry.key)
        data = (json.dumps(entry.to_json(), sort_keys=True, indent=1) + "\n").encode("utf-8")
        with self._deciding():
            withheld = self._withheld(str(path.parent)).get(entry.key)
            if withheld is not None:
                return withheld, False
            if create_exclusive(path, data):
                return entry, True
        stored = self._load(path, entry.key)
        if stored is None:  # entries are never deleted by this module
            raise StateError(f"ledger entry {path} vanished while sealing; is something deleting state files?")
        return stored, False

    def seal_many(self, entries: Iterable[ReleaseEntry]) -> list[tuple[ReleaseEntry, bool]]:
        """``seal`` for many withheld windows at once: one durable batch file per spec, one lock, one fsync.

        Returns (stored entry, created) per entry, in order, with ``seal``'s meaning. Only ``WITHHELD`` entries
        are accepted: they are final, so they never need the per-key file ``mark_published`` rewrites.
        """
        entries = list(entries)
        for entry in entries:
            if entry.status != WITHHELD:
                raise ValueError(f"seal_many takes withheld entries only; {entry.key} is {entry.status!r}")
        if len({e.key for e in entries}) != len(entries):
            raise ValueError("seal_many got the same key twice")
        by_dir: dict[str, list[int]] = {}
        names = []
        for i, entry in enumerate(entries):
            spec_part, name = entry.key.slug.split("/")
            names.append(f"{name}.json")
            by_dir.setdefault(os.path.join(self.root, spec_part), []).append(i)
        out: list[tuple[ReleaseEntry, bool] | None] = [None] * len(entries)
        with self._deciding():
            for spec_dir, indices in by_dir.items():
                per_key = {item.name for item in _scan(spec_dir) if item.name.endswith(".json")}
                withheld = self._withheld(spec_dir)
                new = []
                for i in indices:
                    key = entries[i].key
                    on_disk = names[i] in per_key
                    stored = self._load(os.path.join(spec_dir, names[i]), key) if on_disk else withheld.get(key)
                    out[i] = (stored, False) if stored is not None else (entries[i], True)
                    if stored is None:
                        new.append(entries[i])
                if new:
                    name, data = _batch_file(new)
                    if not create_exclusive(Path(spec_dir) / WITHHELD_DIR / name, data):
                        raise StateError(f"withheld batch {spec_dir}/{WITHHELD_DIR}/{name} exists but its entries "
                                         "were not found; is something editing the ledger?")
                    self._batches[spec_dir][name] = new
        return [o for o in out if o is not None]

    def mark_published(self, key: ReleaseKey, now_ms: int | None = None) -> None:
        """Mark a sealed entry published (idempotent: the first publication time is kept)."""
        entry = self.get(key)
        if entry is None:
            raise StateError(f"cannot mark {key} published: it was never sealed in {self.root}")
        if entry.status == WITHHELD:
            raise StateError(f"cannot mark {key} published: its window was withheld, for good")
        if entry.published:
            return
        published = replace(entry, status=PUBLISHED, published_at_ms=_now_ms() if now_ms is None else now_ms)
        atomic_write_json(self.path_of(key), published.to_json())

    def entries(self, spec_id: str | None = None) -> Iterator[ReleaseEntry]:
        """Every entry (of one spec if given), in no particular order."""
        if spec_id is not None:
            spec_dirs = [str(self.root / ReleaseKey(spec_id, None, 0).spec_dir)]
        else:
            spec_dirs = [d.path for d in _scan(self.root) if d.is_dir() and not d.name.startswith(".")]
        for spec_dir in spec_dirs:
            withheld = self._withheld(spec_dir)
            for item in _scan(spec_dir):
                if item.name.endswith(".json") and not item.name.startswith("."):
                    entry = self._load(item.path)
                    if entry is None:
                        continue
                    if spec_id is not None and entry.key.spec_id != spec_id:
                        raise StateError(f"ledger entry {item.path} belongs to {entry.key.spec_id}, not {spec_id}")
                    if entry.key in withheld:
                        raise StateError(f"{entry.key} is sealed twice: {item.path} and a withheld batch")
                    yield entry
            for entry in withheld.values():
                if spec_id is not None and entry.key.spec_id != spec_id:
                    raise StateError(f"withheld batch entry {entry.key} in {spec_dir} does not belong to {spec_id}")
                yield entry

    def released(self, spec_id: str) -> dict[tuple[str | None, int], ReleaseEntry]:
        """A spec's entries keyed by (crowd_id, window_end_ms), for per-element lookups."""
        return {(e.key.crowd_id, e.key.window_end_ms): e for e in self.entries(spec_id)}

    def unpublished(self) -> list[ReleaseEntry]:
        """Sealed entries never marked published (a crash between seal and publish), oldest window first."""
        pending = [e for e in self.entries() if e.status == SEALED]
        return sorted(pending, key=lambda e: (e.key.window_end_ms, e.key.spec_id, e.key.crowd_id or ""))


def _batch_file(entries: list[ReleaseEntry]) -> tuple[str, bytes]:
    """(name, bytes) of a withheld batch: a versioned header line, then one JSON entry per line."""
    header = {"format": BATCH_FORMAT, "version": BATCH_VERSION, "count": len(entries)}
    lines = [json.dumps(header, sort_keys=True)] + [json.dumps(e.to_json(), sort_keys=True) for e in entries]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    return f"{hashlib.sha256(data).hexdigest()[:24]}.jsonl", data


def _read_batch(path: str) -> list[ReleaseEntry]:
    with open(path, "rb") as handle:
        lines = handle.read().splitlines()
    header = parse_json(lines[0], path) if lines else None
    if not isinstance(header, dict) or header.get("format") != BATCH_FORMAT:
        raise StateError(f"{path} is not a withheld batch of the release ledger")
    if header.get("version") != BATCH_VERSION:
        raise StateError(f"{path}: withheld batch version {header.get('version')!r}, this esa reads {BATCH_VERSION}")
    if header.get("count") != len(lines) - 1:
        raise StateError(f"{path}: header says {header.get('count')} entries, the file holds {len(lines) - 1}")
    out = []
    for line in lines[1:]:
        try:
            entry = ReleaseEntry.from_json(parse_json(line, path))
        except (KeyError, TypeError, ValueError) as err:
            raise StateError(f"invalid entry in withheld batch {path}: {err}") from None
        if entry.status != WITHHELD:
            raise StateError(f"{path} holds {entry.key} with status {entry.status!r}; a batch holds withheld only")
        out.append(entry)
    return out


def _scan(directory: Path | str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as it:
            return list(it)
    except FileNotFoundError:
        return []
