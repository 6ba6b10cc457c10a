"""Staging: what a pipeline run hands to its driver, written into the run's staging location.

The driver acts on staged results only after the whole pipeline succeeded (seal, publish, commit), so a
run that dies leaves nothing visible outside its staging location. Elements are staged in *batches*, a few
files per bundle rather than one per element (20,000 closed windows used to cost 20,000 files, each fsynced):
a batch file holds (name, pickled element) pairs, its own name is a digest of its element names, and the
loader keeps one element per name. Names are derived from the element (not from the bundle), so a retried
bundle -- grouped the same or differently -- adds no second copy of anything.

The location is a local directory (the default, ``STATE/staging/<run key>``) or a URL that Beam's
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
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

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
VERSION = 1
MAX_BATCH_BYTES = 8 << 20  # flush a bundle's buffer past this many pickled bytes (bounded worker memory)
MAX_BATCH_ELEMENTS = 50_000  # ... or this many elements
KEEP_IN_MEMORY = 1 << 20  # iter_staged re-reads elements this large from their file instead of holding them


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


def write_batch(directory: Location, prefix: str, named: Iterable[tuple[str, bytes]]) -> str | None:
    """Write (name, pickled element) pairs as one file ``<prefix>-<digest of names>.pkl``; None if empty."""
    items = sorted(named)
    if not items:
        return None
    digest = hashlib.sha256("\n".join(name for name, _ in items).encode()).hexdigest()[:24]
    path = join(directory, f"{prefix}-{digest}.pkl")
    write_staged(path, pickle.dumps({"format": FORMAT, "version": VERSION, "items": items},
                                    protocol=pickle.HIGHEST_PROTOCOL))
    return path


class StageFn(StagingDoFn):
    """Stage elements in batches of a bundle (see the module doc); ``name_of`` names an element stably."""

    def __init__(self, directory: Location, prefix: str, name_of: Callable[[Any], str],
                 max_bytes: int = MAX_BATCH_BYTES, max_elements: int = MAX_BATCH_ELEMENTS):
        super().__init__(directory)
        self._prefix, self._name_of = prefix, name_of
        self._max_bytes, self._max_elements = max_bytes, max_elements
        self._buffer: list[tuple[str, bytes]] = []
        self._bytes = 0

    def start_bundle(self) -> None:
        self._buffer, self._bytes = [], 0

    def process(self, element: Any) -> Iterator[None]:
        data = pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL)
        self._buffer.append((self._name_of(element), data))
        self._bytes += len(data)
        if self._bytes >= self._max_bytes or len(self._buffer) >= self._max_elements:
            self._flush()
        return iter(())

    def finish_bundle(self) -> None:
        self._flush()

    def _flush(self) -> None:
        write_batch(self._directory, self._prefix, self._buffer)
        self._buffer, self._bytes = [], 0


def _read_batch(path: str) -> list[tuple[str, bytes]]:
    try:
        obj = pickle.loads(read_listed(path))
    except Exception as err:  # any unpickling failure: the file is not what this run staged
        raise StagingError(f"staged file {path} is damaged: {err}") from None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise StagingError(f"staged file {path} is not a staged batch (format {FORMAT!r})")
    if obj.get("version") != VERSION:
        raise StagingError(f"staged file {path} has version {obj.get('version')!r}; this esa reads {VERSION}")
    return obj["items"]


def iter_staged(directory: Location, prefix: str) -> Iterator[Any]:
    """Every element staged under ``prefix``, once each, in element-name order (deterministic).

    Elements are unpickled one at a time, so a caller that consumes them as it goes holds one at a time;
    large ones are not even kept pickled meanwhile (see ``iter_staged_lazily``).
    """
    for _, load in iter_staged_lazily(directory, prefix):
        yield load()


def iter_staged_lazily(directory: Location, prefix: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """(name, load) of every element staged under ``prefix``, in element-name order; ``load()`` unpickles it.

    Large elements (``KEEP_IN_MEMORY`` bytes and more: a release's parts) are not held: ``load`` reads them
    from their file, every time it is called -- the driver would otherwise hold every staged release at once.
    """
    by_name: dict[str, bytes | str] = {}  # name -> pickled element, or the path of the file holding it
    for path in staged_files(directory, f"{prefix}-*.pkl"):
        for name, data in _read_batch(path):
            by_name.setdefault(name, data if len(data) < KEEP_IN_MEMORY else path)  # a retried bundle's copy: same
    for name in sorted(by_name):
        held = by_name.pop(name)
        if isinstance(held, str):
            yield name, lambda path=held, name=name: pickle.loads(_element_of(path, name))
        else:
            yield name, lambda data=held: pickle.loads(data)


def _element_of(path: str, name: str) -> bytes:
    for item, data in _read_batch(path):
        if item == name:
            return data
    raise StagingError(f"staged file {path} no longer holds {name}")


def load_staged(directory: Location, prefix: str) -> list[Any]:
    """Every element staged under ``prefix``, once each, in element-name order (deterministic)."""
    return list(iter_staged(directory, prefix))


def read_listed(path: str) -> bytes:
    """The bytes of a file ``staged_files`` just listed (one call to the store, not two)."""
    return Path(path).read_bytes() if not is_url(path) else _read_object(path)
