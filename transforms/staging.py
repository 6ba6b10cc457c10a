"""Staging: what a pipeline run hands to its driver, written into the run's staging location.

The driver acts on staged results only after the whole pipeline succeeded (seal, publish, commit), so a
run that dies leaves nothing visible outside its staging location. Names are derived from the element
(not from the bundle), so a retried bundle overwrites its own files instead of adding copies.

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
from collections.abc import Callable, Iterator
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


class StageFn(StagingDoFn):
    """Write each element to ``directory/<prefix>-<name>.pkl`` (whole; same element -> same file)."""

    def __init__(self, directory: Location, prefix: str, name_of: Callable[[Any], str]):
        super().__init__(directory)
        self._prefix, self._name_of = prefix, name_of

    def process(self, element: Any) -> Iterator[None]:
        path = join(self._directory, f"{self._prefix}-{self._name_of(element)}.pkl")
        write_staged(path, pickle.dumps(element, protocol=pickle.HIGHEST_PROTOCOL))
        return iter(())


def load_staged(directory: Location, prefix: str) -> list[Any]:
    """Every element staged under ``prefix``, in file-name order (deterministic)."""
    return [pickle.loads(read_listed(path)) for path in staged_files(directory, f"{prefix}-*.pkl")]


def read_listed(path: str) -> bytes:
    """The bytes of a file ``staged_files`` just listed (one call to the store, not two)."""
    return Path(path).read_bytes() if not is_url(path) else _read_object(path)
