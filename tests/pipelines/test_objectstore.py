"""The S3 subset that tansu's storage engine relies on, against the real HTTP server (in a thread)."""

from __future__ import annotations

import hashlib
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from pipelines.objectstore import ObjectStore
from pipelines.s3server import _parse_range, make_server

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@pytest.fixture
def url(tmp_path: Path) -> Iterator[str]:
    server = make_server(tmp_path, buckets=("b",), fsync=False)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _call(method: str, url: str, body: bytes | None = None, **headers: str) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method,
                                     headers={k.replace("_", "-"): v for k, v in headers.items()})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def test_conditional_puts_serialise_writers(url: str) -> None:
    status, headers, _ = _call("PUT", f"{url}/b/dir/k.json", b"v1", If_None_Match="*")
    assert status == 200
    first = headers["ETag"]
    assert first == f'"{hashlib.md5(b"v1").hexdigest()}"'  # content MD5, as on S3
    assert _call("PUT", f"{url}/b/dir/k.json", b"v2", If_None_Match="*")[0] == 412  # create only once
    assert _call("PUT", f"{url}/b/dir/k.json", b"v2", If_Match='"stale"')[0] == 412
    status, headers, _ = _call("PUT", f"{url}/b/dir/k.json", b"v2", If_Match=first)
    assert status == 200 and headers["ETag"] != first
    assert _call("PUT", f"{url}/b/dir/k.json", b"v3", If_Match=first)[0] == 412  # the old version is gone
    status, headers, body = _call("GET", f"{url}/b/dir/k.json")
    assert (status, body) == (200, b"v2") and "Last-Modified" in headers
    assert _call("PUT", f"{url}/b/missing", b"x", If_Match="*")[0] == 412


def test_get_head_range_delete_and_errors(url: str) -> None:
    _call("PUT", f"{url}/b/obj", bytes(range(10)))
    status, headers, body = _call("HEAD", f"{url}/b/obj")
    assert status == 200 and headers["Content-Length"] == "10" and body == b""
    status, headers, body = _call("GET", f"{url}/b/obj", Range="bytes=2-4")
    assert (status, body, headers["Content-Range"]) == (206, bytes([2, 3, 4]), "bytes 2-4/10")
    assert _call("GET", f"{url}/b/obj", Range="bytes=-3")[2] == bytes([7, 8, 9])
    assert _call("GET", f"{url}/b/obj", Range="bytes=20-")[0] == 416
    assert _call("GET", f"{url}/b/obj", Range="bytes=x-")[0] == 400
    assert _call("DELETE", f"{url}/b/obj")[0] == 204
    status, _, body = _call("GET", f"{url}/b/obj")
    assert status == 404 and b"NoSuchKey" in body
    assert _call("GET", f"{url}/nobucket/obj")[0] == 404
    assert _call("PUT", f"{url}/nobucket/obj", b"x")[0] == 404
    assert _call("GET", f"{url}/b/a/../../etc/passwd")[0] == 400  # keys never leave the bucket directory
    assert _call("POST", f"{url}/b/obj?restore", b"")[0] == 501  # multipart: tests/deploy/test_s3_staging.py
    assert _call("PUT", f"{url}/b/obj", b"x", If_None_Match="*")[0] == 200


def test_list_objects_v2_prefix_delimiter_and_pages(url: str) -> None:
    keys = ["t/p0/r/00.batch", "t/p0/r/01.batch", "t/p0/w.json", "t/p1/w.json", "u.json"]
    for key in keys:
        _call("PUT", f"{url}/b/{key}", key.encode())
    _call("PUT", f"{url}/b/t", b"a key that is also a prefix")

    def listing(query: str) -> ET.Element:
        status, _, body = _call("GET", f"{url}/b?list-type=2&{query}")
        assert status == 200
        return ET.fromstring(body)

    root = listing("prefix=t/p0/")
    assert [e.text for e in root.iter(f"{NS}Key")] == sorted(k for k in keys if k.startswith("t/p0/"))
    root = listing("prefix=t/&delimiter=/")
    assert [e.text for e in root.iter(f"{NS}Prefix")][1:] == ["t/p0/", "t/p1/"]
    assert list(root.iter(f"{NS}Key")) == []
    root = listing("delimiter=/")
    assert [e.text for e in root.iter(f"{NS}Key")] == ["t", "u.json"]
    seen, token = [], ""
    for _ in range(10):
        root = listing(f"max-keys=2{token}")
        seen += [e.text for e in root.iter(f"{NS}Key")]
        next_token = root.find(f"{NS}NextContinuationToken")
        if root.find(f"{NS}IsTruncated").text == "false":  # type: ignore[union-attr]
            assert next_token is None
            break
        assert next_token is not None
        token = f"&continuation-token={next_token.text}"
    assert seen == sorted([*keys, "t"])


def test_bulk_delete_and_copy(url: str) -> None:
    _call("PUT", f"{url}/b/x", b"1")
    _call("PUT", f"{url}/b/y", b"2")
    status, _, body = _call("PUT", f"{url}/b/z", b"", x_amz_copy_source="/b/x")
    assert status == 200 and b"CopyObjectResult" in body and _call("GET", f"{url}/b/z")[2] == b"1"
    request = b'<Delete><Object><Key>x</Key></Object><Object><Key>y</Key></Object></Delete>'
    status, _, body = _call("POST", f"{url}/b?delete", request)
    assert status == 200 and body.count(b"<Deleted>") == 2
    assert _call("POST", f"{url}/b?delete", b"<not xml")[0] == 400
    assert _call("GET", f"{url}/b/x")[0] == 404 and _call("GET", f"{url}/b/z")[0] == 200


@pytest.mark.parametrize(("header", "expected"), [
    ("bytes=0-0", (0, 0)), ("bytes=5-", (5, 9)), ("bytes=-4", (6, 9)), ("bytes=3-100", (3, 9)),
    ("bytes=10-", None), ("bytes=4-2", None), ("items=0-1", None), ("bytes=0-1,3-4", None),
])
def test_parse_range(header: str, expected: tuple[int, int] | None) -> None:
    assert _parse_range(header, 10) == expected


def test_cached_listings_follow_puts_and_deletes(tmp_path: Path) -> None:
    store = ObjectStore(tmp_path, fsync=False)
    store.create_bucket("b")
    for key in ("p/1", "p/3", "q/1"):
        store.put("b", key, b"x")
    assert store.sorted_keys("b", "p/") == ["p/1", "p/3"]  # scanned and cached
    store.put("b", "p/2", b"x")
    store.put("b", "p/3", b"overwritten")  # not a new key: listed once
    store.delete("b", "p/1")
    store.put("b", "q/2", b"x")
    assert store.sorted_keys("b", "p/") == ["p/2", "p/3"]
    assert store.sorted_keys("b", "") == ["p/2", "p/3", "q/1", "q/2"]
    assert ObjectStore(tmp_path).sorted_keys("b", "p/") == ["p/2", "p/3"]  # a fresh scan agrees


def test_compare_and_swap_loses_no_update_under_contention(tmp_path: Path) -> None:
    """What tansu does to its watermarks: read, then PUT If-Match; the store must never let two win."""
    store = ObjectStore(tmp_path, fsync=False)
    store.create_bucket("b")
    store.put("b", "counter", b"0", if_none_match="*")
    wins = [0] * 8

    def increment(worker: int) -> None:
        done = 0
        while done < 25:
            try:
                fh, meta = store.open("b", "counter")
            except FileNotFoundError:  # never: a rename replaces the file atomically
                raise AssertionError("the counter vanished") from None
            with fh:
                value = int(fh.read())
            try:
                store.put("b", "counter", str(value + 1).encode(), if_match=meta.etag)
            except FileExistsError:
                continue
            done += 1
        wins[worker] = done

    threads = [threading.Thread(target=increment, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert int(store.read("b", "counter")) == sum(wins) == 200


def test_a_file_without_the_header_is_a_server_error_not_data(url: str, tmp_path: Path) -> None:
    (tmp_path / "b" / "stray.obj").write_bytes(b"written by hand")
    status, _, body = _call("GET", f"{url}/b/stray")
    assert status == 500 and b"corrupt object file" in body
