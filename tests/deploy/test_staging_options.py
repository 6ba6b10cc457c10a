"""``--staging_location``: how a job picks its staging root, refuses what cannot work, and arms its workers."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, S3Options

from pipelines.exit_codes import ConfigError
from pipelines.job import staging_root
from pipelines.job_config import JobConfig, config_from_options
from tests.e2e.chain_harness import SPEC_PATH
from transforms.io.staging import StageFn, filesystem_options
from transforms.spec import load_spec


@pytest.fixture(autouse=True)
def _restore_filesystem_options() -> Iterator[None]:
    saved = FileSystems._pipeline_options
    yield
    FileSystems.set_options(saved)


def _options(tmp_path: Path, *flags: str) -> PipelineOptions:
    return PipelineOptions(["--spec", str(SPEC_PATH), "--output_dir", str(tmp_path / "out"), *flags])


def test_default_is_the_state_directory_and_a_url_is_kept_as_given(tmp_path: Path) -> None:
    assert config_from_options(_options(tmp_path)).staging_location is None
    config = config_from_options(_options(tmp_path, "--staging_location=s3://bucket/esa/staging"))
    assert config.staging_location == "s3://bucket/esa/staging"


@pytest.mark.parametrize(("flags", "message"), [
    (["--runner=DataflowRunner"], "give --staging_location gs://"),
    (["--runner=DataflowRunner", "--staging_location=/srv/esa/staging"], "give --staging_location gs://"),
    (["--staging_location=nosuch://bucket/x"], "no Beam filesystem for nosuch://"),
])
def test_unusable_staging_is_a_config_error(tmp_path: Path, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_options(_options(tmp_path, *flags))


def test_each_state_directory_stages_under_its_own_root(tmp_path: Path) -> None:
    spec = load_spec(SPEC_PATH)

    def config(name: str, location: str | None) -> JobConfig:
        return JobConfig(bootstrap="127.0.0.1:1", specs=(spec,), out_dir=tmp_path / name,
                         staging_location=location).for_stage("shuffle")

    local = config("a", None)
    assert staging_root(local, "shuffle") == str(tmp_path / "a.state" / "shuffle" / "staging")
    a, b = config("a", "s3://bucket/p"), config("b", "s3://bucket/p")
    root_a = staging_root(a, "shuffle")
    assert root_a.startswith("s3://bucket/p/esa-shuffle-") and staging_root(a, "shuffle") == root_a  # kept
    assert staging_root(b, "shuffle") != root_a  # two jobs sharing a location never share files


def test_staging_dofns_carry_the_object_store_options_to_a_bare_worker() -> None:
    flags = ["--s3_endpoint_url=http://127.0.0.1:9", "--s3_access_key_id=k", "--s3_region_name=eu-west-1",
             "--kafka_bootstrap=h:1"]
    FileSystems.set_options(PipelineOptions(flags))
    assert filesystem_options() == {"s3_endpoint_url": "http://127.0.0.1:9", "s3_access_key_id": "k",
                                    "s3_region_name": "eu-west-1"}  # nothing but the filesystem's options
    shipped = pickle.dumps(StageFn("s3://bucket/run", "part", str))
    local_only = pickle.dumps(StageFn("/tmp/run", "part", str))
    FileSystems.set_options(None)  # a worker whose harness set no options (a bare worker pool)
    pickle.loads(local_only).setup()
    assert FileSystems._pipeline_options is None  # a local directory needs none
    pickle.loads(shipped).setup()
    s3 = FileSystems._pipeline_options.view_as(S3Options)
    assert (s3.s3_endpoint_url, s3.s3_access_key_id, s3.s3_region_name) == ("http://127.0.0.1:9", "k", "eu-west-1")
