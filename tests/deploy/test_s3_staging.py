"""Staging through Beam's FileSystems against a test S3 server (moto's server mode): the operations staging uses.

Beam's S3 filesystem writes every file as a multipart upload, deletes in batches, lists by prefix and
renames by copy (part by part over 8 MiB). Each is exercised through the real clients (boto3, Beam's
``FileSystems``) over HTTP.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.io.filesystems import FileSystems

from tests.deploy.s3 import S3Endpoint, s3_store
from transforms.io.sinks import StageAvroRecords, load_staged_avro
from transforms.io.staging import (
    StageFn,
    check_location,
    clear_staging,
    iter_staged_entries,
    join,
    load_staged,
    read_staged,
    staged_files,
    write_batch,
    write_staged,
)

MIB = 1 << 20


@pytest.fixture(scope="module")
def s3() -> Iterator[S3Endpoint]:
    with s3_store() as endpoint:
        yield endpoint


def test_multipart_write_read_match_and_rename(s3: S3Endpoint) -> None:
    """What staging asks of a store, through Beam's own S3 filesystem: a 12 MiB file (uploaded in parts), read
    back whole, listed by pattern, renamed (a copy over 8 MiB goes part by part), deleted."""
    root = f"s3://{s3.bucket}/fs"
    data = hashlib.sha256(b"seed").digest() * (12 * MIB // 32)
    write_staged(join(root, "big.bin"), data)
    assert read_staged(join(root, "big.bin")) == data
    assert [m.path for m in FileSystems.match([join(root, "*.bin")])[0].metadata_list] == [join(root, "big.bin")]
    FileSystems.rename([join(root, "big.bin")], [join(root, "moved.bin")])
    assert read_staged(join(root, "moved.bin")) == data and read_staged(join(root, "big.bin")) is None
    FileSystems.delete([join(root, "moved.bin")])
    assert s3.keys("fs/") == []


def test_beam_filesystems_stage_load_and_clear(s3: S3Endpoint) -> None:
    root = f"s3://{s3.bucket}/esa-test/run1"
    big = bytes(MIB + 7)
    write_staged(join(root, "big.bin"), big)
    assert read_staged(join(root, "big.bin")) == big
    assert read_staged(join(root, "missing.bin")) is None
    with beam.Pipeline(options=s3.options()) as pipeline:
        _ = (pipeline | beam.Create([("b", 2), ("a", 1), ("c", 3)])
             | beam.ParDo(StageFn(root, "part", lambda kv: kv[0])))
    assert load_staged(root, "part") == [("a", 1), ("b", 2), ("c", 3)]  # element-name order
    assert load_staged(root, "held") == []
    assert len(staged_files(root, "part-*.pkl")) == 1  # one batch for the bundle, not one object per element
    write_batch(root, "part", [("a", pickle.dumps(("a", 1))), ("d", pickle.dumps(("d", 4)))])  # a retry, regrouped
    assert load_staged(root, "part") == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]  # no second copy of "a"
    write_batch(root, "part", [("d", pickle.dumps(("d", 4))), ("e", pickle.dumps(("e", big)))], headers={"e": "E"})
    (entry,) = [e for e in iter_staged_entries(root, "part") if e.name == "e"]
    assert entry.header == "E" and entry.data is None  # listed from the batch's index, its bytes not read yet
    assert entry.load() == ("e", big)  # its own byte range, read through the object store
    clear_staging(root)
    assert s3.keys("esa-test/") == []
    clear_staging(root)  # clearing what is not there is not an error


def test_dead_letters_are_staged_as_avro_shards_rewritten_identically(s3: S3Endpoint) -> None:
    root = f"s3://{s3.bucket}/esa-avro/run1"
    letters = [{"schema_version": 1, "original": bytes([i]), "topic": "t", "partition": 0, "offset": i,
                "stage": "shuffle", "reason": "bad"} for i in range(40)]

    def stage(records: list[dict]) -> dict[str, bytes]:
        with beam.Pipeline(options=s3.options()) as pipeline:
            _ = pipeline | beam.Create(records) | StageAvroRecords(root, "dead_letters", "DeadLetter", shards=4)
        return {k: read_staged(f"s3://{s3.bucket}/{k}") for k in s3.keys("esa-avro/")}

    first = stage(letters)
    assert 1 < len(first) <= 4 and all(k.startswith("esa-avro/run1/dead_letters-") for k in first)
    assert sorted(r["offset"] for r in load_staged_avro(root, "dead_letters")) == list(range(40))
    assert stage(letters[::-1]) == first  # a rerun (other bundles, other order) rewrites the very same bytes
    clear_staging(root)
    assert load_staged_avro(root, "dead_letters") == []


def test_unusable_locations_fail_at_once(tmp_path: Path) -> None:
    check_location(str(tmp_path))  # a local directory is always fine
    with pytest.raises(ValueError, match="no Beam filesystem for nosuch://"):
        check_location("nosuch://bucket/prefix")
