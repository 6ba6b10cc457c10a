"""Staging: what a pipeline run hands to its driver, written into the run's staging location.

The driver acts on staged results only after the whole pipeline succeeded (seal, publish, commit), so a
run that dies leaves nothing visible outside its staging location. Elements are staged in *batches*, a few
files per bundle rather than one per element (20,000 closed windows used to cost 20,000 files, each fsynced):
a batch file holds an index (per element its name, byte range and an optional small header) then the pickled
elements, its own name is a digest of its element names, and the loader keeps one element per name. The
index lets the driver list a release's parts and read their headers without reading their messages, and
read each part alone, when its turn comes (``StagedEntry``). Names are derived from the element (not from
the bundle), so a retried bundle -- grouped the same or differently -- adds no second copy of anything.

The location is a local directory (the default, ``STATE/staging/<run key>.<attempt>``) or a URL that Beam's
``FileSystems`` serves (``gs://``, ``s3://``): the workers of a Dataflow or Flink cluster cannot write the
driver's disk, but they can write an object store the driver reads back. Local files are written with an
atomic rename; objects are atomic by themselves (an upload becomes visible only once it is complete).

Workers need the object store's options (endpoint, credentials) for their own ``FileSystems`` calls. A
harness started by a runner's boot program gets them from the job; a bare worker pool does not. So every
staging DoFn carries the filesystem options the driver's ``FileSystems`` held when the pipeline was built
(``pipelines.job.plan_run`` sets them from the job's options) and installs them in ``setup`` when the
worker has none.
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    AzureOptions,
    GoogleCloudOptions,
    HadoopFileSystemOptions,
    PipelineOptions,
    S3Options,
)

from transforms.state.files import atomic_write_bytes

Location = str | Path
FORMAT = "esa-staged-batch"
VERSION = 2
MAGIC = b"ESA-STG\x02"  # a version-2 batch; version 1 was one pickle (first byte 0x80)
INDEX_SIZE = struct.Struct(">Q")
MAX_BATCH_BYTES = 8 << 20  # flush a bundle's buffer past this many pickled bytes (bounded worker memory)
MAX_BATCH_ELEMENTS = 50_000  # ... or this many elements
KEEP_IN_MEMORY = 1 << 20  # elements this large are read from their file when loaded, not held (StagedEntry)


class StagingError(RuntimeError):
    """A staged file that this version cannot read (another format, or damaged)."""


def stable_name(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:24]


def is_url(location: Location) -> bool:
    """True for ``scheme://...`` locations (served by a Beam filesystem), False for local paths."""
    return FileSystems.get_scheme(str(location)) is not None


def join(location: Location, *names: str) -> str:
    """``location/name/...`` in the location's own syntax (a URL stays a URL)."""
    return FileSystems.join(str(location), *names) if is_url(location) else str(Path(location).joinpath(*names))


def check_location(location: str) -> None:
    """Fail now, with the fix, if no installed Beam filesystem can write ``location`` (not on a worker later)."""
    if not is_url(location):
        return
    scheme = FileSystems.get_scheme(location)
    try:
        FileSystems.get_filesystem(location)
    except ValueError as err:
        extra = {"gs": "esa-telemetry[gcp]", "s3": "esa-telemetry[aws]", "azfs": "apache-beam[azure]"}.get(scheme or "")
        hint = f" (install {extra})" if extra else ""
        raise ValueError(f"staging location {location}: no Beam filesystem for {scheme}://{hint}") from err
    if scheme == "s3":
        try:
            import boto3  # noqa: F401  (Beam's S3 filesystem imports it lazily and fails late without it)
        except ImportError as err:
            raise ValueError(f"staging location {location}: s3:// needs boto3 (install esa-telemetry[aws])") from err


def write_staged(path: str, data: bytes) -> None:
    """Write one staged file whole: a reader sees the old content, the new one, or nothing."""
    if not is_url(path):
        atomic_write_bytes(Path(path), data)
        return
    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.write(data)


def read_staged(path: str) -> bytes | None:
    """The bytes of a staged file, or None if it does not exist."""
    if not is_url(path):
        local = Path(path)
        return local.read_bytes() if local.is_file() else None
    try:
        return _read_object(path)
    except Exception:
        if FileSystems.exists(path):  # asked only after a failure: an object store call costs a client each
            raise
        return None


def _read_object(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


def staged_files(location: Location, pattern: str) -> list[str]:
    """Paths of the staged files under ``location`` whose name matches the glob ``pattern``, sorted."""
    if not is_url(location):
        return sorted(str(p) for p in Path(location).glob(pattern))
    matched = FileSystems.match([join(location, pattern)])[0].metadata_list
    return sorted(m.path for m in matched)


def clear_staging(location: Location) -> None:
    """Remove ``location`` and everything under it (nothing to do if it does not exist)."""
    if not is_url(location):
        shutil.rmtree(location, ignore_errors=True)
        return
    # A trailing slash makes Beam's object stores delete the whole prefix (objects have no directories).
    FileSystems.delete([str(location).rstrip("/") + "/"])


def prepare_staging(location: Location) -> None:
    """An empty staging location: local directories are created; object stores need nothing."""
    clear_staging(location)
    if not is_url(location):
        Path(location).mkdir(parents=True)


_FILESYSTEM_OPTIONS = (S3Options, GoogleCloudOptions, AzureOptions, HadoopFileSystemOptions)


def filesystem_options() -> dict[str, Any]:
    """The object-store options (S3, GCS, Azure, HDFS) of the driver's ``FileSystems`` that differ from
    Beam's defaults (nothing else of the job's options travels with the DoFn)."""
    current = FileSystems._pipeline_options
    if current is None:
        return {}
    names = set().union(*(_option_names(view) for view in _FILESYSTEM_OPTIONS))
    return {k: v for k, v in current.get_all_options(drop_default=True).items() if k in names}


def _option_names(view: type[PipelineOptions]) -> set[str]:
    import argparse

    parser = argparse.ArgumentParser()
    view._add_argparse_args(parser)
    return {action.dest for action in parser._actions if action.dest != "help"}


class StagingDoFn(beam.DoFn):
    """A DoFn that writes under a staging location, with the filesystem options it needs on any worker."""

    def __init__(self, directory: Location):
        self._directory = str(directory)
        self._filesystem = filesystem_options() if is_url(self._directory) else {}

    def setup(self) -> None:
        if self._filesystem and FileSystems._pipeline_options is None:
            FileSystems.set_options(PipelineOptions.from_dictionary(self._filesystem))


def write_batch(directory: Location, prefix: str, named: Iterable[tuple[str, bytes]],
                headers: Mapping[str, Any] | None = None) -> str | None:
    """Write (name, pickled element) pairs as one file ``<prefix>-<digest of names>.pkl``; None if empty.

    The file is ``MAGIC``, the length of its index, the index -- per element its name, byte range and the
    small header ``headers`` gives it (None without one) -- then the elements: a reader learns names and
    headers, and reads one element, without reading the others (``StagedEntry``).
    """
    items = sorted(named)
    if not items:
        return None
    digest = hashlib.sha256("\n".join(name for name, _ in items).encode()).hexdigest()[:24]
    path = join(directory, f"{prefix}-{digest}.pkl")
    index, start = [], 0
    for name, data in items:
        index.append((name, start, start + len(data), None if headers is None else headers.get(name)))
        start += len(data)
    head = pickle.dumps({"format": FORMAT, "version": VERSION, "items": index}, protocol=pickle.HIGHEST_PROTOCOL)
    write_staged(path, b"".join([MAGIC, INDEX_SIZE.pack(len(head)), head, *(data for _, data in items)]))
    return path


class StageFn(StagingDoFn):
    """Stage elements in batches of a bundle (see the module doc); ``name_of`` names an element stably."""

    def __init__(self, directory: Location, prefix: str, name_of: Callable[[Any], str],
                 max_bytes: int = MAX_BATCH_BYTES, max_elements: int = MAX_BATCH_ELEMENTS,
                 header_of: Callable[[Any], Any] | None = None):
        """``header_of``: a small summary of an element, staged in the file's index (``StagedEntry.header``) so
        the driver can decide about an element before, or without, reading it."""
        super().__init__(directory)
        self._prefix, self._name_of, self._header_of = prefix, name_of, header_of
        self._max_bytes, self._max_elements = max_bytes, max_elements
        self._buffer: list[tuple[str, bytes]] = []
        self._headers: dict[str, Any] = {}
        self._bytes = 0

    def start_bundle(self) -> None:
        self._buffer, self._headers, self._bytes = [], {}, 0

    def process(self, element: Any) -> Iterator[None]:
        data = pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL)
        name = self._name_of(element)
        self._buffer.append((name, data))
        if self._header_of is not None:
            self._headers[name] = self._header_of(element)
        self._bytes += len(data)
        if self._bytes >= self._max_bytes or len(self._buffer) >= self._max_elements:
            self._flush()
        return iter(())

    def finish_bundle(self) -> None:
        self._flush()

    def _flush(self) -> None:
        write_batch(self._directory, self._prefix, self._buffer, self._headers if self._header_of else None)
        self._buffer, self._headers, self._bytes = [], {}, 0


@dataclass(frozen=True, slots=True)
class StagedEntry:
    """One staged element: its name, the header it was staged with (None without one), where its bytes are.

    A small element's bytes are kept from the listing; a large one (``KEEP_IN_MEMORY`` bytes and more: a
    release's parts) is read from its byte range of its file at every ``load``, and never before.
    """

    name: str
    header: Any
    path: str
    start: int
    stop: int
    data: bytes | None = None

    @property
    def size(self) -> int:
        return self.stop - self.start

    def load(self) -> Any:
        data = self.data if self.data is not None else _read_range(self.path, self.start, self.stop)
        try:
            return pickle.loads(data)
        except Exception as err:
            raise StagingError(f"staged element {self.name} of {self.path} is damaged: {err}") from None


def _open(path: str) -> BinaryIO:
    if not is_url(path):
        return open(path, "rb")
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def _read_range(path: str, start: int, stop: int) -> bytes:
    try:
        with _open(path) as handle:
            handle.seek(start)
            data = handle.read(stop - start)
    except Exception as err:
        raise StagingError(f"staged file {path} is damaged or gone: {err}") from None
    if len(data) != stop - start:
        raise StagingError(f"staged file {path} is damaged: truncated at byte {start + len(data)} of {stop}")
    return data


def _read_at(handle: BinaryIO, start: int, size: int) -> bytes:
    handle.seek(start)
    return handle.read(size)


def _checked(obj: Any, path: str, version: int) -> list[Any]:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise StagingError(f"staged file {path} is not a staged batch (format {FORMAT!r})")
    if obj.get("version") != version:
        raise StagingError(f"staged file {path} has version {obj.get('version')!r}; this esa reads {VERSION}")
    return obj["items"]


def staged_entries(path: str) -> list[StagedEntry]:
    """The elements of one staged batch file, reading its index and its small elements only.

    Files of version 1 (one pickle, no index, written by an earlier esa into a staging location that outlived
    it) are read whole; their large elements are then held too.
    """
    try:
        with _open(path) as handle:
            magic = handle.read(len(MAGIC))
            if magic != MAGIC:
                items = _checked(pickle.loads(magic + handle.read()), path, 1)
                return [StagedEntry(name, None, path, 0, len(data), data) for name, data in items]
            (size,) = INDEX_SIZE.unpack(handle.read(INDEX_SIZE.size))
            base = len(MAGIC) + INDEX_SIZE.size + size
            entries = [StagedEntry(name, header, path, base + start, base + stop)
                       for name, start, stop, header in _checked(pickle.loads(handle.read(size)), path, VERSION)]
            if all(e.size < KEEP_IN_MEMORY for e in entries):
                rest = handle.read()  # one read for a file of small elements (one request to an object store)
                kept = [replace(e, data=rest[e.start - base:e.stop - base]) for e in entries]
            else:
                kept = [e if e.size >= KEEP_IN_MEMORY else replace(e, data=_read_at(handle, e.start, e.size))
                        for e in entries]
    except StagingError:
        raise
    except Exception as err:  # any unpickling or reading failure: the file is not what this run staged
        raise StagingError(f"staged file {path} is damaged: {err}") from None
    for e in kept:
        if e.data is not None and len(e.data) != e.size:
            raise StagingError(f"staged file {path} is damaged: element {e.name} is truncated")
    return kept


def iter_staged_entries(directory: Location, prefix: str) -> Iterator[StagedEntry]:
    """Every element staged under ``prefix``, once each (a retried bundle's copy is the same), in element-name
    order; only small elements are held meanwhile (see ``StagedEntry``)."""
    by_name: dict[str, StagedEntry] = {}
    for path in staged_files(directory, f"{prefix}-*.pkl"):
        for entry in staged_entries(path):
            by_name.setdefault(entry.name, entry)
    for name in sorted(by_name):
        yield by_name.pop(name)


def iter_staged(directory: Location, prefix: str) -> Iterator[Any]:
    """Every element staged under ``prefix``, once each, in element-name order (deterministic).

    Elements are unpickled one at a time, so a caller that consumes them as it goes holds one at a time;
    large ones are not even kept pickled meanwhile (see ``StagedEntry``).
    """
    for entry in iter_staged_entries(directory, prefix):
        yield entry.load()


def iter_staged_lazily(directory: Location, prefix: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, load) of every element staged under ``prefix``, in element-name order; ``load()`` unpickles it
    (a large element is read from its file at every call)."""
    for entry in iter_staged_entries(directory, prefix):
        yield entry.name, entry.load


def load_staged(directory: Location, prefix: str) -> list[Any]:
    """Every element staged under ``prefix``, once each, in element-name order (deterministic)."""
    return list(iter_staged(directory, prefix))


def read_listed(path: str) -> bytes:
    """The bytes of a file ``staged_files`` just listed (one call to the store, not two)."""
    return Path(path).read_bytes() if not is_url(path) else _read_object(path)
