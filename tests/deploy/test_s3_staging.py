"""Staging through Beam's FileSystems against the project's S3 server: the operations Beam and boto3 use.

Beam's S3 filesystem writes every file as a multipart upload, deletes in batches, lists by prefix and
renames by copy; boto3 copies objects over 8 MiB part by part (UploadPartCopy with byte ranges). Each of
these is exercised here through the real clients (boto3, ``FileSystems``) against a real server process.
"""

from __future__ import annotations

import hashlib
import http.client
import pickle
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import apache_beam as beam
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from pipelines.objectstore import MIN_PART
from tests.deploy.s3 import S3Endpoint, s3_store
from transforms.sinks import StageAvroRecords, load_staged_avro
from transforms.staging import (
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


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Endpoint]:
    with s3_store(tmp_path_factory.mktemp("s3")) as endpoint:
        yield endpoint


def _code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return err.value.response["Error"]["Code"]


def test_multipart_upload_joins_parts_and_mirrors_s3_refusals(s3: S3Endpoint) -> None:
    client, first, last = s3.client(), bytes(range(256)) * (MIN_PART // 256), b"tail"
    upload = client.create_multipart_upload(Bucket=s3.bucket, Key="mp/a")["UploadId"]
    e1 = client.upload_part(Bucket=s3.bucket, Key="mp/a", UploadId=upload, PartNumber=1, Body=first)["ETag"]
    e2 = client.upload_part(Bucket=s3.bucket, Key="mp/a", UploadId=upload, PartNumber=2, Body=last)["ETag"]
    assert e1 == f'"{hashlib.md5(first).hexdigest()}"'
    with pytest.raises(ClientError) as err:  # wrong ETag for a part
        client.complete_multipart_upload(Bucket=s3.bucket, Key="mp/a", UploadId=upload, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": e2}, {"PartNumber": 2, "ETag": e2}]})
    assert _code(err) == "InvalidPart"
    with pytest.raises(ClientError) as err:  # out of order
        client.complete_multipart_upload(Bucket=s3.bucket, Key="mp/a", UploadId=upload, MultipartUpload={
            "Parts": [{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]})
    assert _code(err) == "InvalidPartOrder"
    assert s3.keys("mp/") == []  # nothing is visible before the upload completes
    done = client.complete_multipart_upload(Bucket=s3.bucket, Key="mp/a", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert done["ETag"] == f'"{hashlib.md5(first + last).hexdigest()}"'
    assert client.get_object(Bucket=s3.bucket, Key="mp/a")["Body"].read() == first + last
    with pytest.raises(ClientError) as err:  # a completed upload is gone
        client.upload_part(Bucket=s3.bucket, Key="mp/a", UploadId=upload, PartNumber=3, Body=b"x")
    assert _code(err) == "NoSuchUpload"

    small = client.create_multipart_upload(Bucket=s3.bucket, Key="mp/b")["UploadId"]
    parts = [{"PartNumber": n, "ETag": client.upload_part(Bucket=s3.bucket, Key="mp/b", UploadId=small,
                                                          PartNumber=n, Body=b"short")["ETag"]} for n in (1, 2)]
    with pytest.raises(ClientError) as err:  # a part other than the last is under 5 MiB
        client.complete_multipart_upload(Bucket=s3.bucket, Key="mp/b", UploadId=small,
                                         MultipartUpload={"Parts": parts})
    assert _code(err) == "EntityTooSmall"
    client.abort_multipart_upload(Bucket=s3.bucket, Key="mp/b", UploadId=small)
    with pytest.raises(ClientError) as err:
        client.complete_multipart_upload(Bucket=s3.bucket, Key="mp/b", UploadId=small,
                                         MultipartUpload={"Parts": parts[:1]})
    assert _code(err) == "NoSuchUpload"
    assert s3.keys("mp/") == ["mp/a"]


def test_large_copy_goes_part_by_part_with_source_ranges(s3: S3Endpoint) -> None:
    client = s3.client()
    data = hashlib.sha256(b"seed").digest() * ((2 * MIN_PART + 12345) // 32)
    client.put_object(Bucket=s3.bucket, Key="big/src", Body=data)
    config = TransferConfig(multipart_threshold=MIN_PART, multipart_chunksize=MIN_PART)
    client.copy({"Bucket": s3.bucket, "Key": "big/src"}, s3.bucket, "big/dst", Config=config)  # 3 UploadPartCopy
    assert client.get_object(Bucket=s3.bucket, Key="big/dst")["Body"].read() == data
    client.delete_objects(Bucket=s3.bucket, Delete={"Objects": [{"Key": "big/src"}, {"Key": "big/dst"}]})


def test_aws_chunked_bodies_are_decoded(s3: S3Endpoint) -> None:
    """A streaming upload (``Content-Encoding: aws-chunked`` with a trailing checksum) stores the payload."""
    payload = b"0123456789" * 7
    body = (b"40\r\n" + payload[:64] + b"\r\n" + b"6\r\n" + payload[64:] + b"\r\n0\r\n"
            b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n")
    url = urlsplit(s3.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
    connection.request("PUT", f"/{s3.bucket}/chunked", body=body, headers={
        "Content-Encoding": "aws-chunked", "x-amz-decoded-content-length": str(len(payload)),
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "x-amz-trailer": "x-amz-checksum-crc32"})
    assert connection.getresponse().status == 200
    assert s3.client().get_object(Bucket=s3.bucket, Key="chunked")["Body"].read() == payload


def test_beam_filesystems_stage_load_and_clear(s3: S3Endpoint) -> None:
    root = f"s3://{s3.bucket}/esa-test/run1"
    big = bytes(MIN_PART + 7)  # Beam uploads it in two parts
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
