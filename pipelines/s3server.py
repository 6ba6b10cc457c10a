"""A loopback-only S3 endpoint over `pipelines.objectstore`: what tansu's ``s3://`` storage engine talks to.

Served: GET/HEAD (with ``Range``, ``If-Match``, ``If-None-Match``), PUT (conditional, and CopyObject), DELETE,
``POST ?delete``, ListObjectsV2 (prefix, delimiter, continuation token, start-after), HEAD and PUT bucket, and
multipart uploads (create, UploadPart, UploadPartCopy with a source range, complete, abort): Beam's S3
filesystem writes every file as a multipart upload, boto3 copies large objects part by part. Bodies sent
with ``aws-chunked`` content encoding (streaming uploads, trailing checksums) are decoded. Not served (501):
HTTP chunked transfer encoding, ListParts and ListMultipartUploads, versioning, ACLs. Requests are not
authenticated (any signature is accepted): the server binds 127.0.0.1 only. HTTP/1.1 keep-alive, one
thread per connection.

    python -m pipelines.s3server --root DIR [--port P] [--bucket B] [--lock F] [--endpoint-file F] [--no-fsync]

prints the endpoint URL on stdout, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import fcntl
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit
from xml.etree import ElementTree as ET
from xml.sax.saxutils import escape

from pipelines.objectstore import HEADER, CorruptObjectError, ObjectStore, UploadError
from pipelines.s3wire import decode_aws_chunked as _decode_aws_chunked
from pipelines.s3wire import parse_range as _parse_range

MAX_BODY = 256 * 1024 * 1024
MAX_KEYS = 1000
_NS = "http://s3.amazonaws.com/doc/2006-03-01/"
_QUOT = {'"': "&quot;"}


def _iso(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms delayed-ACK stall
    server_version = "esa-objectstore"
    store: ObjectStore  # set on the subclass made by `make_server`

    def log_message(self, format: str, *args: object) -> None:
        pass

    # -- plumbing ---------------------------------------------------------------------------------------
    def _split(self) -> tuple[str, str, dict[str, list[str]]]:
        url = urlsplit(self.path)
        bucket, _, key = unquote(url.path).lstrip("/").partition("/")
        return bucket, key, parse_qs(url.query, keep_blank_values=True)

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/xml", head: bool = False) -> None:
        """`headers` may set Content-Length (a HEAD reports the object's size without sending it)."""
        headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{escape(message)}</Message></Error>").encode()
        self._send(status, body, head=head)

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self._error(HTTPStatus.NOT_IMPLEMENTED, "NotImplemented", "chunked uploads are not supported")
            self.close_connection = True
            return None
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "EntityTooLarge", f"body over {MAX_BODY} bytes")
            self.close_connection = True
            return None
        body = self.rfile.read(length) if length else b""
        encoding = self.headers.get("Content-Encoding", "").lower()
        if "aws-chunked" in encoding or self.headers.get("x-amz-content-sha256", "").startswith("STREAMING-"):
            body = _decode_aws_chunked(body)
        return body

    def _guard(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except UploadError as exc:
            self._error(exc.status, exc.code, str(exc))
        except CorruptObjectError as exc:
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "InternalError", str(exc))
        except (KeyError, ValueError, ET.ParseError) as exc:  # bad key, range, number or XML
            self._error(HTTPStatus.BAD_REQUEST, "InvalidArgument", str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- verbs --------------------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._guard(lambda: self._get(head=True))

    def do_GET(self) -> None:
        self._guard(lambda: self._get(head=False))

    def _get(self, head: bool) -> None:
        bucket, key, query = self._split()
        if not key:
            if not self.store.has_bucket(bucket):
                self._error(HTTPStatus.NOT_FOUND, "NoSuchBucket", bucket, head=head)
            elif head:
                self._send(HTTPStatus.OK, head=True)
            else:
                self._list(bucket, query)
            return
        try:
            fh, meta = self.store.open(bucket, key)
        except FileNotFoundError:
            self._error(HTTPStatus.NOT_FOUND, "NoSuchKey", key, head=head)
            return
        with fh:
            start, end = 0, meta.size - 1
            status = HTTPStatus.OK
            headers = {"ETag": meta.etag, "Last-Modified": formatdate(meta.mtime, usegmt=True),
                       "Accept-Ranges": "bytes"}
            if_match, if_none = self.headers.get("If-Match"), self.headers.get("If-None-Match")
            if if_match is not None and if_match not in ("*", meta.etag):
                self._error(HTTPStatus.PRECONDITION_FAILED, "PreconditionFailed", key, head=head)
                return
            if if_none is not None and if_none in ("*", meta.etag):
                self._send(HTTPStatus.NOT_MODIFIED, b"", {"ETag": meta.etag}, head=True)
                return
            rng = self.headers.get("Range")
            if rng and not head:
                parsed = _parse_range(rng, meta.size)
                if parsed is None:
                    headers["Content-Range"] = f"bytes */{meta.size}"
                    self._send(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, b"", headers)
                    return
                start, end = parsed
                status = HTTPStatus.PARTIAL_CONTENT
                headers["Content-Range"] = f"bytes {start}-{end}/{meta.size}"
            if head:
                headers["Content-Length"] = str(meta.size)
                self._send(status, b"", headers, "application/octet-stream", head=True)
                return
            fh.seek(HEADER + start)
            self._send(status, fh.read(end - start + 1), headers, "application/octet-stream")

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        after = max(query.get("continuation-token", [""])[0], query.get("start-after", [""])[0])
        max_keys = min(int(query.get("max-keys", [str(MAX_KEYS)])[0]), MAX_KEYS)
        keys = self.store.sorted_keys(bucket, prefix)
        page: list[tuple[str, bool]] = []  # (name, is a common prefix)
        i = bisect.bisect_right(keys, after)
        while i < len(keys) and len(page) <= max_keys:
            key = keys[i]
            cut = key.find(delimiter, len(prefix)) if delimiter else -1
            if cut < 0:
                page.append((key, False))
                i += 1
                continue
            common = key[: cut + len(delimiter)]
            if common > after:  # a token that is a common prefix skips all of its keys
                page.append((common, True))
            i = bisect.bisect_left(keys, common + "\U0010ffff", i)  # past every key under `common`
        truncated = len(page) > max_keys
        page = page[:max_keys]
        parts = [f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{_NS}">',
                 f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(page)}</KeyCount>",
                 f"<MaxKeys>{max_keys}</MaxKeys><IsTruncated>{str(truncated).lower()}</IsTruncated>"]
        if delimiter:
            parts.append(f"<Delimiter>{escape(delimiter)}</Delimiter>")
        if truncated:
            parts.append(f"<NextContinuationToken>{escape(page[-1][0])}</NextContinuationToken>")
        for name, is_common in page:
            if is_common:
                parts.append(f"<CommonPrefixes><Prefix>{escape(name)}</Prefix></CommonPrefixes>")
                continue
            meta = self.store.meta(bucket, name)
            if meta is None:  # deleted while listing
                continue
            parts.append(f"<Contents><Key>{escape(name)}</Key><LastModified>{_iso(meta.mtime)}</LastModified>"
                         f"<ETag>{escape(meta.etag, _QUOT)}</ETag>"
                         f"<Size>{meta.size}</Size><StorageClass>STANDARD</StorageClass></Contents>")
        parts.append("</ListBucketResult>")
        self._send(HTTPStatus.OK, "".join(parts).encode())

    def do_PUT(self) -> None:
        self._guard(self._put)

    def _put(self) -> None:
        bucket, key, query = self._split()
        body = self._body()
        if body is None:
            return
        if not key:
            self.store.create_bucket(bucket)
            self._send(HTTPStatus.OK)
            return
        if "partNumber" in query or "uploadId" in query:
            self._put_part(bucket, key, query, body)
            return
        source = self.headers.get("x-amz-copy-source")
        if source is not None:
            body = self._copy_source(source)
            if body is None:
                return
        try:
            etag = self.store.put(bucket, key, body, self.headers.get("If-Match"), self.headers.get("If-None-Match"))
        except FileExistsError:
            self._error(HTTPStatus.PRECONDITION_FAILED, "PreconditionFailed", f"precondition failed for {key}")
            return
        except FileNotFoundError:
            self._error(HTTPStatus.NOT_FOUND, "NoSuchBucket", bucket)
            return
        if source is not None:
            result = (f'<?xml version="1.0" encoding="UTF-8"?><CopyObjectResult><ETag>{escape(etag)}</ETag>'
                      f"<LastModified>{_iso(time.time())}</LastModified>"
                      "</CopyObjectResult>").encode()
            self._send(HTTPStatus.OK, result, {"ETag": etag})
        else:
            self._send(HTTPStatus.OK, b"", {"ETag": etag})

    def _copy_source(self, source: str, byte_range: str | None = None) -> bytes | None:
        """The bytes ``x-amz-copy-source`` names (``bucket/key[?versionId=..]``), or None after a 404/416."""
        src_bucket, _, src_key = unquote(source.split("?", 1)[0]).lstrip("/").partition("/")
        try:
            data = self.store.read(src_bucket, src_key)
        except FileNotFoundError:
            self._error(HTTPStatus.NOT_FOUND, "NoSuchKey", src_key)
            return None
        if byte_range is None:
            return data
        parsed = _parse_range(byte_range, len(data))
        if parsed is None or byte_range.strip().split("=", 1)[-1].startswith("-"):
            self._error(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE, "InvalidRange", byte_range)
            return None
        return data[parsed[0]: parsed[1] + 1]

    def _put_part(self, bucket: str, key: str, query: dict[str, list[str]], body: bytes) -> None:
        """UploadPart, or UploadPartCopy when ``x-amz-copy-source`` is set (optionally a byte range of it)."""
        upload_id, number = query.get("uploadId", [""])[0], int(query.get("partNumber", ["0"])[0])
        source = self.headers.get("x-amz-copy-source")
        if source is not None:
            data = self._copy_source(source, self.headers.get("x-amz-copy-source-range"))
            if data is None:
                return
            etag = self.store.put_part(upload_id, bucket, key, number, data)
            result = (f'<?xml version="1.0" encoding="UTF-8"?><CopyPartResult xmlns="{_NS}"><ETag>'
                      f"{escape(etag, _QUOT)}</ETag><LastModified>{_iso(time.time())}</LastModified></CopyPartResult>")
            self._send(HTTPStatus.OK, result.encode())
            return
        self._send(HTTPStatus.OK, b"", {"ETag": self.store.put_part(upload_id, bucket, key, number, body)})

    def do_DELETE(self) -> None:
        self._guard(self._delete)

    def _delete(self) -> None:
        bucket, key, query = self._split()
        self._body()
        if "uploadId" in query:
            self.store.abort_upload(query["uploadId"][0], bucket, key)
        else:
            self.store.delete(bucket, key)
        self._send(HTTPStatus.NO_CONTENT)

    def do_POST(self) -> None:
        self._guard(self._post)

    def _post(self) -> None:
        bucket, key, query = self._split()
        body = self._body()
        if body is None:
            return
        if key and "uploads" in query:
            self._create_upload(bucket, key)
            return
        if key and "uploadId" in query:
            self._complete_upload(bucket, key, query["uploadId"][0], body)
            return
        if "delete" not in query:
            self._error(HTTPStatus.NOT_IMPLEMENTED, "NotImplemented",
                        "only POST ?delete, ?uploads and ?uploadId are supported")
            return
        deleted = []
        for element in ET.fromstring(body).iter():
            if element.tag.rsplit("}", 1)[-1] == "Key" and element.text:
                self.store.delete(bucket, element.text)
                deleted.append(f"<Deleted><Key>{escape(element.text)}</Key></Deleted>")
        result = f'<?xml version="1.0" encoding="UTF-8"?><DeleteResult xmlns="{_NS}">{"".join(deleted)}</DeleteResult>'
        self._send(HTTPStatus.OK, result.encode())


    def _create_upload(self, bucket: str, key: str) -> None:
        try:
            upload_id = self.store.create_upload(bucket, key)
        except FileNotFoundError:
            self._error(HTTPStatus.NOT_FOUND, "NoSuchBucket", bucket)
            return
        result = (f'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult xmlns="{_NS}">'
                  f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key><UploadId>{upload_id}</UploadId>"
                  "</InitiateMultipartUploadResult>")
        self._send(HTTPStatus.OK, result.encode())

    def _complete_upload(self, bucket: str, key: str, upload_id: str, body: bytes) -> None:
        parts = []
        for part in ET.fromstring(body) if body else []:
            fields = {child.tag.rsplit("}", 1)[-1]: (child.text or "") for child in part}
            if part.tag.rsplit("}", 1)[-1] == "Part":
                parts.append((int(fields["PartNumber"]), fields["ETag"]))
        etag = self.store.complete_upload(upload_id, bucket, key, parts)
        result = (f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult xmlns="{_NS}">'
                  f"<Location>/{escape(bucket)}/{escape(key)}</Location><Bucket>{escape(bucket)}</Bucket>"
                  f"<Key>{escape(key)}</Key><ETag>{escape(etag, _QUOT)}</ETag></CompleteMultipartUploadResult>")
        self._send(HTTPStatus.OK, result.encode())


def make_server(root: Path, port: int = 0, *, buckets: tuple[str, ...] = (), fsync: bool = True
                ) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:`port` (0: any free port) over `root`, creating `buckets`."""
    store = ObjectStore(root, fsync=fsync)
    for bucket in buckets:
        store.create_bucket(bucket)
    handler = type("Handler", (_Handler,), {"store": store})
    server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", action="append", default=[])
    parser.add_argument("--lock", type=Path, default=None, help="hold an exclusive flock on this file while serving")
    parser.add_argument("--endpoint-file", type=Path, default=None, help="write the URL here while serving")
    parser.add_argument("--no-fsync", action="store_true", help="faster; survives process kills, not power loss")
    args = parser.parse_args(argv)
    args.root.mkdir(parents=True, exist_ok=True)
    lock = None
    if args.lock is not None:
        lock = args.lock.open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"objectstore: {args.lock} is held by another store serving {args.root}", file=sys.stderr)
            return 3
    try:
        server = make_server(args.root, args.port, buckets=tuple(args.bucket), fsync=not args.no_fsync)
    except OSError as exc:
        print(f"objectstore: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    url = f"http://127.0.0.1:{server.server_address[1]}"
    if args.endpoint_file is not None:
        tmp = args.endpoint_file.with_name(args.endpoint_file.name + ".tmp")
        tmp.write_text(url + "\n")
        os.replace(tmp, args.endpoint_file)
    print(url, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if args.endpoint_file is not None:
            with contextlib.suppress(FileNotFoundError):
                args.endpoint_file.unlink()
        if lock is not None:
            lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
