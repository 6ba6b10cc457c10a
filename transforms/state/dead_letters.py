"""Dead letters stay in the trust domain that produced them; analysts get identifier-free counts.

A dead letter carries the original record, its Kafka coordinates and a reason that may name the client
("duplicate: client c17 already sent ..."). Those must not leave the shuffler's trust domain, so the
shuffler keeps its letters in its own state directory (``DeadLetterStore``), one Avro file per run, and
hands the analyst side only ``ReasonCounts``: counts per (stage, reason class), where ``reason_class`` keeps
the kind of failure and drops every identifier.

Originals are capped at ``MAX_ORIGINAL_BYTES`` so a flood of huge garbage messages cannot fill the disk.
A truncated letter records the full length and a SHA-256 of the full original, enough to match it against
the topic later. Untruncated letters carry no digest: the original itself is there, and "digest present"
then means exactly "original truncated".
"""

from __future__ import annotations

import hashlib
import io
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import fastavro
from fastavro.validation import ValidationError

from schemas import avro_file_schema
from transforms.state.files import StateError, atomic_write_bytes, atomic_write_json, read_json

MAX_ORIGINAL_BYTES = 64 * 1024
#: Reasons may quote a field of the record ("no spec consumes metric '...'"): capped so that a huge field
#: cannot make a huge letter (or carry the record's content past the original's cap).
MAX_REASON_CHARS = 1024
_RUN_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")
_LETTERS_PREFIX, _COUNTS_PREFIX = "dead-letters-", "dead-letter-counts-"


def _check_run_key(run_key: str) -> str:
    if not isinstance(run_key, str) or not _RUN_KEY.fullmatch(run_key):
        raise ValueError(f"run_key must be 1-64 characters of [A-Za-z0-9_-], got {run_key!r}")
    return run_key


def truncate_original(original: bytes | None) -> tuple[bytes | None, str | None]:
    """(the first ``MAX_ORIGINAL_BYTES`` of ``original``, ``"sha256:<hex>"`` of all of it if it was cut, else
    None)."""
    if original is None or len(original) <= MAX_ORIGINAL_BYTES:
        return original, None
    return bytes(original[:MAX_ORIGINAL_BYTES]), "sha256:" + hashlib.sha256(original).hexdigest()


def bounded_letter(record: Mapping[str, Any]) -> dict[str, Any]:
    """A DeadLetter record with every schema field and the original capped (idempotent)."""
    fields = avro_file_schema("DeadLetter")["fields"]
    letter = {f["name"]: record.get(f["name"], f.get("default")) for f in fields}
    unknown = set(record) - set(letter)
    if unknown:
        raise ValueError(f"dead letter has fields the DeadLetter schema lacks: {sorted(unknown)}")
    reason = letter["reason"]
    if isinstance(reason, str) and len(reason) > MAX_REASON_CHARS:
        letter["reason"] = f"{reason[:MAX_REASON_CHARS - 48]}... (reason of {len(reason)} characters cut)"
    original = letter["original"]
    if original is not None:
        if letter["original_length"] is None:
            letter["original_length"] = len(original)
        cut, digest = truncate_original(original)
        if digest is not None:
            letter["original"], letter["original_digest"] = cut, digest
    return letter


class DeadLetterStore:
    """``root/dead-letters-<run_key>.avro``: one Avro container file per run, replaced by a rerun."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path_of(self, run_key: str) -> Path:
        return self.root / f"{_LETTERS_PREFIX}{_check_run_key(run_key)}.avro"

    def write_run(self, run_key: str, records: Iterable[Mapping[str, Any]]) -> Path | None:
        """Write a run's letters atomically; None (and no file) if there are none.

        A rerun of a crashed attempt has the same ``run_key`` and reads the same input, so it replaces the
        attempt's file with the same letters instead of duplicating them.
        """
        path = self.path_of(run_key)
        letters = [bounded_letter(r) for r in records]
        if not letters:
            return None
        buf = io.BytesIO()
        try:
            fastavro.writer(buf, avro_file_schema("DeadLetter"), letters, codec="deflate", validator=True)
        except ValidationError as err:
            raise ValueError(f"dead letter does not match schemas/DeadLetter.avsc: {err}") from None
        atomic_write_bytes(path, buf.getvalue())
        return path

    def files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f"{_LETTERS_PREFIX}*.avro") if not p.name.startswith("."))

    def read_all(self) -> list[dict[str, Any]]:
        """Every letter of every run, read with the current schema (older files get the new fields' defaults).

        Letters with Kafka coordinates are deduplicated by (topic, partition, offset, stage): runs that
        overlap after a crash see the same record twice, and it is one dead letter.
        """
        out: list[dict[str, Any]] = []
        seen: set[tuple[Any, ...]] = set()
        for path in self.files():
            try:
                with path.open("rb") as handle:
                    letters = list(fastavro.reader(handle, reader_schema=avro_file_schema("DeadLetter")))
            except (ValueError, EOFError, OSError) as err:
                raise StateError(f"cannot read dead letters {path}: {err}") from None
            for letter in letters:
                if None not in (letter["topic"], letter["partition"], letter["offset"]):
                    key = (letter["topic"], letter["partition"], letter["offset"], letter["stage"])
                    if key in seen:
                        continue
                    seen.add(key)
                out.append(letter)
        return out


# --- the analyst-side view ---------------------------------------------------------------------------------

_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_BRACKETED = re.compile(r"\([^()]*\)|\[[^\[\]]*\]|\{[^{}]*\}|<[^<>]*>")
_WORD = re.compile(r"[A-Za-z][A-Za-z_-]{0,31}")
_HEX_WORD = re.compile(r"[0-9A-Fa-f]{6,}")
_INTRODUCERS = frozenset({"client", "device", "user", "id", "key"})
_MAX_CLASS = 80


def reason_class(reason: str) -> str:
    """A short class of a dead-letter reason with no identifiers in it.

    Keeps the text before the first ':' (our reasons put the kind first and the particulars after), drops
    quoted and bracketed parts and everything after an unclosed bracket or quote, every token with a digit
    or a symbol (ids, spec hashes, offsets, numbers), long hex-looking words, and "client <id>" (also
    device, user, id, key). "duplicate: client abc123 already sent 1 report(s)" -> "duplicate". Idempotent.
    """
    head = str(reason).split(":", 1)[0]
    head = _QUOTED.sub(" ", head)
    for _ in range(4):  # nested brackets, innermost first
        head = _BRACKETED.sub(" ", head)
    head = re.split(r"[(\[{<'\"`]", head, maxsplit=1)[0]
    words, skip = [], False
    for token in head.split():
        if skip:
            skip = False
            continue
        word = token.strip(".,;!?")
        if word.lower() in _INTRODUCERS:  # "client <id>": both go, so that a second pass changes nothing
            skip = True
        elif _WORD.fullmatch(word) and not _HEX_WORD.fullmatch(word):
            words.append(word)
    return " ".join(words)[:_MAX_CLASS].rstrip() or "other"


class ReasonCounts:
    """Dead-letter counts per (stage, reason class): what the analyst may see of the shuffler's rejects."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def add(self, stage: str, reason: str, n: int = 1) -> ReasonCounts:
        """Count ``n`` letters; ``reason`` may be a raw reason (it is classified here, so no id is stored)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if n:
            self._counts[(reason_class(stage), reason_class(reason))] += n
        return self

    def add_letters(self, letters: Iterable[Mapping[str, Any]]) -> ReasonCounts:
        for letter in letters:
            self.add(letter["stage"], letter["reason"])
        return self

    def merge(self, other: ReasonCounts) -> ReasonCounts:
        self._counts.update(other._counts)
        return self

    def total(self) -> int:
        return sum(self._counts.values())

    def to_rows(self) -> list[dict[str, Any]]:
        return [{"stage": s, "reason": r, "count": c} for (s, r), c in sorted(self._counts.items())]

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> ReasonCounts:
        counts = cls()
        for row in rows:
            counts.add(row["stage"], row["reason"], int(row["count"]))
        return counts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReasonCounts) and self._counts == other._counts

    def __repr__(self) -> str:
        return f"ReasonCounts({self.to_rows()})"


def write_counts(root: Path, run_key: str, counts: ReasonCounts) -> Path:
    """``root/dead-letter-counts-<run_key>.json`` (atomic; a rerun replaces its crashed attempt's file)."""
    path = Path(root) / f"{_COUNTS_PREFIX}{_check_run_key(run_key)}.json"
    atomic_write_json(path, {"run_key": run_key, "counts": counts.to_rows()})
    return path


def read_counts(root: Path) -> ReasonCounts:
    """The sum of every run's counts under ``root``."""
    total = ReasonCounts()
    root = Path(root)
    if not root.is_dir():
        return total
    for path in sorted(root.glob(f"{_COUNTS_PREFIX}*.json")):
        obj = read_json(path)
        try:
            total.merge(ReasonCounts.from_rows(obj["counts"]))
        except (KeyError, TypeError, ValueError) as err:
            raise StateError(f"invalid dead-letter counts {path}: {err}") from None
    return total
