"""The project's loopback S3 store as a test fixture: a real server process, a boto3 client, Beam's S3 options.

The store (``pipelines.localstore`` running ``pipelines.s3server``) ignores request signatures, but boto3
and Beam's S3 filesystem insist on credentials and a region: placeholders are passed explicitly, so a
developer's own AWS profile is never read, and no AWS variable of the environment is trusted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.localstore import LocalObjectStore

CREDENTIALS = {"aws_access_key_id": "esa-test", "aws_secret_access_key": "esa-test", "region_name": "us-east-1"}


@dataclass(frozen=True)
class S3Endpoint:
    url: str
    bucket: str

    def flags(self) -> list[str]:
        """Beam's S3Options for this endpoint (what a job gets on its command line)."""
        return [f"--s3_endpoint_url={self.url}", f"--s3_access_key_id={CREDENTIALS['aws_access_key_id']}",
                f"--s3_secret_access_key={CREDENTIALS['aws_secret_access_key']}",
                f"--s3_region_name={CREDENTIALS['region_name']}"]

    def options(self, *extra: str) -> PipelineOptions:
        return PipelineOptions([*self.flags(), *extra])

    def client(self) -> Any:
        import boto3

        return boto3.session.Session().client("s3", endpoint_url=self.url, **CREDENTIALS)

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix`` (all pages)."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]


@contextmanager
def s3_store(data_dir: Path, bucket: str = "staging") -> Iterator[S3Endpoint]:
    """Start a store over ``data_dir`` (a subprocess), create ``bucket``, point Beam's FileSystems at it."""
    store = LocalObjectStore(data_dir, fsync=False).start()
    saved = FileSystems._pipeline_options
    try:
        assert store.url is not None
        endpoint = S3Endpoint(store.url, bucket)
        endpoint.client().create_bucket(Bucket=bucket)
        FileSystems.set_options(endpoint.options())
        yield endpoint
    finally:
        FileSystems.set_options(saved)
        store.stop()
