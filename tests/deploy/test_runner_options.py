"""``--streaming`` and the runners' outside parts: refused with one line where they cannot work, filled in from
the project's cache where they can (no broker and no registry needed: the checks run before anything connects,
and the cache is a temporary directory holding the files a fetch would have put there)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions, PrismRunnerOptions

from pipelines.exit_codes import ConfigError
from pipelines.job_config import config_from_options
from pipelines.runners import BEAM_VERSION, flink_job_server_coordinates

REPO = Path(__file__).resolve().parents[2]
SPEC = str(REPO / "examples" / "app_language.toml")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("ESA_CACHE_DIR", str(root))
    return root


def _options(tmp_path: Path, *flags: str) -> PipelineOptions:
    return PipelineOptions(["--spec", SPEC, "--output_dir", str(tmp_path / "out"), *flags])


@pytest.mark.parametrize(("flags", "message"), [
    (("--streaming",), "only the streaming shuffler"),  # a bounded job: --streaming would do nothing
    (("--streaming", "--runner=PrismRunner"), "only the streaming shuffler"),
    (("--streaming", "--kafka_io", "sdf", "--stop_after_idle_seconds", "1"), "in-process runner cannot"),
    (("--streaming", "--kafka_io", "sdf", "--runner=DirectRunner", "--stop_after_idle_seconds", "1"),
     "cannot run an unbounded"),
    (("--kafka_io", "sdf", "--runner=FlinkRunner", "--job_endpoint=localhost:1"), "needs --streaming"),
    (("--kafka_io", "sdf", "--runner=DataflowRunner"), "needs --streaming"),
])
def test_streaming_where_it_cannot_work_is_refused(tmp_path: Path, cache: Path, flags: tuple[str, ...],
                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_options(_options(tmp_path, *flags))


def test_the_cli_refuses_streaming_on_a_bounded_job_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "encode", "--spec", SPEC, "--output_dir",
                           str(tmp_path / "out"), "--streaming"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "--streaming" in line]
    assert len(errors) == 1 and "drop --streaming" in errors[0], done.stderr[-2000:]


def test_esa_run_refuses_streaming_rather_than_stream_its_bounded_stages(tmp_path: Path, cache: Path) -> None:
    from pipelines import end_to_end

    binary = cache / "bin" / f"prism-{BEAM_VERSION}"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"#!prism")
    flags = ["--spec", SPEC, "--output_dir", str(tmp_path / "out"), "--kafka_io", "sdf", "--streaming",
             "--runner=PrismRunner"]
    with pytest.raises(ConfigError, match="esa shuffle --kafka_io sdf --streaming"):
        end_to_end.run_from_argv(flags)


def test_streaming_shuffler_on_flink_with_streaming_is_accepted(tmp_path: Path, cache: Path) -> None:
    options = _options(tmp_path, "--kafka_io", "sdf", "--runner=FlinkRunner", "--streaming",
                       "--flink_job_server_jar=/opt/job-server.jar")
    assert config_from_options(options).kafka_io == "sdf"
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar == "/opt/job-server.jar"  # the operator's


def test_prism_location_comes_from_the_cache(tmp_path: Path, cache: Path) -> None:
    binary = cache / "bin" / f"prism-{BEAM_VERSION}"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(b"#!prism")
    options = _options(tmp_path, "--runner=PrismRunner")
    config_from_options(options)
    assert options.view_as(PrismRunnerOptions).prism_location == str(binary)
    given = _options(tmp_path, "--runner=PrismRunner", "--prism_location=/usr/local/bin/prism")
    config_from_options(given)
    assert given.view_as(PrismRunnerOptions).prism_location == "/usr/local/bin/prism"


def test_the_flink_job_server_jar_comes_from_the_cache_at_this_beam_version(tmp_path: Path, cache: Path) -> None:
    jar = cache / "maven" / f"beam-runners-flink-1.20-job-server-{BEAM_VERSION}.jar"
    jar.parent.mkdir(parents=True)
    jar.write_bytes(b"PK")
    options = _options(tmp_path, "--runner=FlinkRunner", "--flink_version=1.20", "--flink_master=localhost:8081")
    config_from_options(options)
    assert options.view_as(FlinkRunnerOptions).flink_job_server_jar == str(jar)
    assert flink_job_server_coordinates("1.20") == \
        f"org.apache.beam:beam-runners-flink-1.20-job-server:{BEAM_VERSION}"


def test_a_job_server_that_cannot_be_fetched_is_one_line_naming_the_artifact(
        tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mvn to fetch with, nothing cached
    with pytest.raises(ConfigError) as refused:
        config_from_options(_options(tmp_path, "--runner=FlinkRunner", "--flink_master=localhost:8081"))
    message = str(refused.value)
    assert "\n" not in message
    assert f"beam-runners-flink-2.2-job-server:{BEAM_VERSION}" in message and "--flink_job_server_jar" in message


@pytest.mark.slow
def test_a_served_jar_is_fetched_once_then_found_offline(tmp_path: Path, cache: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetch path the Flink job server takes, on a jar Maven does serve (its bytes: a zip archive)."""
    from pipelines.artifacts import maven_jar

    jar = maven_jar("junit:junit:4.13.2")
    assert jar == cache / "maven" / "junit-4.13.2.jar" and jar.read_bytes()[:2] == b"PK"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no mvn now: the cached jar is enough
    assert maven_jar("junit:junit:4.13.2") == jar
