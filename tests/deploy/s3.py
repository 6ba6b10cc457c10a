"""A test S3 server (moto's server mode, in this process's threads), a boto3 client and Beam's S3 options.

Why moto's server and not its in-process mocks: Beam's S3 filesystem and the staging children talk to an
endpoint URL over HTTP, exactly as they would to S3 or a MinIO-like store, so the real clients and wire
protocol are exercised. Placeholder credentials are passed explicitly, so a developer's own AWS profile is
never read, and no AWS variable of the environment is trusted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions
from moto.server import ThreadedMotoServer

from pipelines.broker import free_loopback_port

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
def s3_store(bucket: str = "staging") -> Iterator[S3Endpoint]:
    """Start moto's S3 server on a free loopback port, create ``bucket``, point Beam's FileSystems at it."""
    port = free_loopback_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = FileSystems._pipeline_options
    try:
        endpoint = S3Endpoint(f"http://127.0.0.1:{port}", bucket)
        endpoint.client().create_bucket(Bucket=bucket)
        FileSystems.set_options(endpoint.options())
        yield endpoint
    finally:
        FileSystems.set_options(saved)
        server.stop()
