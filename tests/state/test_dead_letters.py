"""Dead letters: capped originals with digests, run files, dedupe, and identifier-free reason counts."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import fastavro
import pytest

from transforms.io.dead_letters import dead_letter
from transforms.state.dead_letters import (
    MAX_ORIGINAL_BYTES,
    DeadLetterStore,
    ReasonCounts,
    read_counts,
    reason_class,
    truncate_original,
    write_counts,
)
from transforms.wire.elements import SourceRef


def test_truncate_original() -> None:
    assert truncate_original(None) == (None, None)
    assert truncate_original(b"abc") == (b"abc", None)
    exact = os.urandom(MAX_ORIGINAL_BYTES)
    assert truncate_original(exact) == (exact, None)
    big = os.urandom(MAX_ORIGINAL_BYTES + 1)
    kept, digest = truncate_original(big)
    assert kept == big[:MAX_ORIGINAL_BYTES]
    assert digest == "sha256:" + hashlib.sha256(big).hexdigest()


def test_dead_letter_records_are_capped_where_they_are_made() -> None:
    big = os.urandom(3 * MAX_ORIGINAL_BYTES)
    letter = dead_letter("decode", "not an Avro single-object message", original=big,
                         source=SourceRef("telemetry", 1, 5))
    assert len(letter["original"]) == MAX_ORIGINAL_BYTES and letter["original_length"] == len(big)
    assert letter["original_digest"] == "sha256:" + hashlib.sha256(big).hexdigest()
    small = dead_letter("decode", "x", original=b"12")
    assert small["original_length"] == 2 and small["original_digest"] is None


def letters(offsets: range, stage: str = "shuffle", original: bytes = b"\xc3\x01x") -> list[dict]:
    return [dead_letter(stage, f"duplicate: client c{o} already sent 1 report(s)", original=original,
                        source=SourceRef("reports", 0, o), spec_id="s@0123456789ab") for o in offsets]


def test_write_run_and_read_back_with_truncation(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path / "dead")
    big = os.urandom(MAX_ORIGINAL_BYTES + 10)
    raw = {**letters(range(1))[0], "original": big, "original_length": None, "original_digest": None}
    path = store.write_run("run1", [raw, *letters(range(1, 3))])
    assert path == tmp_path / "dead" / "dead-letters-run1.avro"
    back = store.read_all()
    assert len(back) == 3
    assert back[0]["original"] == big[:MAX_ORIGINAL_BYTES] and back[0]["original_length"] == len(big)
    assert back[0]["original_digest"] == "sha256:" + hashlib.sha256(big).hexdigest()
    assert back[1:] == letters(range(1, 3))


def test_no_records_writes_nothing_and_a_rerun_replaces_its_file(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path)
    assert store.write_run("run1", []) is None and store.files() == []
    store.write_run("run1", letters(range(5)))
    store.write_run("run1", letters(range(3)))  # the rerun of a crashed attempt
    assert store.files() == [tmp_path / "dead-letters-run1.avro"]
    assert len(store.read_all()) == 3


def test_read_all_dedupes_overlapping_runs_by_source_and_stage(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path)
    store.write_run("a", letters(range(0, 10)))
    store.write_run("b", letters(range(5, 15)) + letters(range(5, 7), stage="decode"))
    tombstone = dead_letter("decode", "tombstone")  # no coordinates: never merged with another letter
    store.write_run("c", [tombstone, tombstone])
    back = store.read_all()
    coords = [(d["offset"], d["stage"]) for d in back if d["offset"] is not None]
    assert sorted(coords) == sorted([(o, "shuffle") for o in range(15)] + [(5, "decode"), (6, "decode")])
    assert sum(d["reason"] == "tombstone" for d in back) == 2


def test_files_of_the_old_schema_read_with_defaults(tmp_path: Path) -> None:
    old_schema = fastavro.parse_schema({
        "type": "record", "name": "DeadLetter", "namespace": "esa.telemetry",
        "fields": [{"name": "schema_version", "type": "int"},
                   {"name": "original", "type": ["null", "bytes"], "default": None},
                   {"name": "topic", "type": ["null", "string"], "default": None},
                   {"name": "partition", "type": ["null", "int"], "default": None},
                   {"name": "offset", "type": ["null", "long"], "default": None},
                   {"name": "stage", "type": "string"}, {"name": "reason", "type": "string"},
                   {"name": "spec_id", "type": ["null", "string"], "default": None}]})
    buf = io.BytesIO()
    fastavro.writer(buf, old_schema, [{"schema_version": 1, "original": b"x", "topic": "t", "partition": 0,
                                       "offset": 1, "stage": "decode", "reason": "r", "spec_id": None}])
    (tmp_path / "dead-letters-old.avro").write_bytes(buf.getvalue())
    (back,) = DeadLetterStore(tmp_path).read_all()
    assert back["original"] == b"x" and back["original_length"] is None and back["original_digest"] is None


def test_bad_input_is_refused(tmp_path: Path) -> None:
    store = DeadLetterStore(tmp_path)
    with pytest.raises(ValueError, match="run_key"):
        store.write_run("../escape", letters(range(1)))
    with pytest.raises(ValueError, match="lacks"):
        store.write_run("r", [{**letters(range(1))[0], "client_id": "c1"}])
    with pytest.raises(ValueError, match="DeadLetter"):
        store.write_run("r", [{**letters(range(1))[0], "stage": None}])


@pytest.mark.parametrize(("reason", "expected"), [
    ("duplicate: client abc123 already sent 1 report(s)", "duplicate"),
    ("late: arrived after its window (ending 1700000000000) closed", "late"),
    ("report for spec lang@0123456789ab reached the shuffler of lang@ba9876543210",
     "report for spec reached the shuffler of"),
    ("message set with 2 presence markers (expected exactly 1) (client alice)", "message set with presence markers"),
    ("flood (client alice)", "flood"),
    ("not an Avro single-object message (missing C3 01 header)", "not an Avro single-object message"),
    ("unknown writer schema fingerprint abababababababab", "unknown writer schema fingerprint"),
    ("unknown Report schema_version 99 (supported: [1])", "unknown Report schema_version"),
    ("category 'fr-CA' is not in the domain of app_language", "category is not in the domain of app_language"),
    ("3 trailing bytes after the Report datum", "trailing bytes after the Report datum"),
    ("client deadbeef sent junk", "sent junk"),
    ("bad key alice", "bad"),
    ("device Bob's phone failed", "other"),
    ("12345", "other"),
    ("", "other"),
])
def test_reason_class_keeps_the_kind_and_drops_identifiers(reason: str, expected: str) -> None:
    assert reason_class(reason) == expected
    assert reason_class(expected) == expected  # idempotent


def test_reason_counts_merge_rows_and_files_carry_no_identifiers(tmp_path: Path) -> None:
    a = ReasonCounts().add("shuffle", "duplicate: client abc123 already sent 1 report(s)")
    a.add("shuffle", "duplicate: client zzz already sent 2 report(s)", 4).add("decode", "tombstone", 0)
    b = ReasonCounts().add_letters([*letters(range(3)), dead_letter("decode", "tombstone")])
    merged = ReasonCounts().merge(a).merge(b)
    assert merged.to_rows() == [{"stage": "decode", "reason": "tombstone", "count": 1},
                                {"stage": "shuffle", "reason": "duplicate", "count": 8}]
    assert ReasonCounts.from_rows(merged.to_rows()) == merged and merged.total() == 9
    with pytest.raises(ValueError):
        a.add("shuffle", "x", -1)
    path = write_counts(tmp_path, "run1", a)
    write_counts(tmp_path, "run2", b)
    write_counts(tmp_path, "run2", b)  # a rerun replaces, it does not add
    text = path.read_text()
    assert "abc123" not in text and "zzz" not in text
    assert json.loads(text)["run_key"] == "run1"
    assert read_counts(tmp_path) == merged
    assert read_counts(tmp_path / "missing").total() == 0
