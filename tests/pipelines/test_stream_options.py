"""``--kafka_io sdf`` and ``--stop_after_idle_seconds``: accepted where they can work, refused with the fix
where they cannot (no broker needed: the checks run before anything connects)."""

from __future__ import annotations

from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines.exit_codes import ConfigError
from pipelines.job_config import config_from_options
from transforms.shuffler.streaming import RegistryWatch

SPEC = str(Path(__file__).resolve().parents[2] / "examples" / "app_language.toml")


def _config(tmp_path: Path, *flags: str):
    return config_from_options(PipelineOptions(["--spec", SPEC, "--output_dir", str(tmp_path / "out"), *flags]))


def test_sdf_with_an_idle_stop_on_the_local_runner(tmp_path: Path) -> None:
    config = _config(tmp_path, "--kafka_io", "sdf", "--stop_after_idle_seconds", "2.5")
    assert (config.kafka_io, config.stop_after_idle_seconds) == ("sdf", 2.5)


def test_sdf_on_a_portable_runner_runs_until_stopped(tmp_path: Path) -> None:
    config = _config(tmp_path, "--kafka_io", "sdf", "--runner=PortableRunner", "--job_endpoint=localhost:1")
    assert (config.kafka_io, config.stop_after_idle_seconds) == ("sdf", None)


@pytest.mark.parametrize(("flags", "message"), [
    (("--kafka_io", "sdf"), "needs --stop_after_idle_seconds"),
    (("--kafka_io", "sdf", "--stop_after_idle_seconds", "1", "--follow"), "drop --follow"),
    (("--kafka_io", "xlang"), "Flink runner only"),
    (("--kafka_io", "xlang", "--runner=PrismRunner"), "Flink runner only"),
    (("--kafka_io", "xlang", "--runner=FlinkRunner", "--job_endpoint=localhost:1", "--stop_after_idle_seconds", "1"),
     "applies to --kafka_io sdf only"),
    (("--stop_after_idle_seconds", "3"), "applies to --kafka_io sdf only"),
    (("--kafka_io", "sdf", "--stop_after_idle_seconds", "-1"), "must be >= 0"),
])
def test_what_cannot_work_is_refused(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, *flags)


def test_registry_watch_sees_a_rewritten_registry(tmp_path: Path) -> None:
    path = tmp_path / "devices.parquet"
    path.write_bytes(b"one")
    watch = RegistryWatch(str(path), every_s=0.0)
    watch.start()
    assert not watch.changed()
    path.write_bytes(b"one and two")  # a re-enrolment rewrites the file (size and mtime change)
    assert watch.changed()
    assert not watch.changed()
    slow = RegistryWatch(str(path), every_s=3600.0)
    slow.start()
    path.write_bytes(b"three")
    assert not slow.changed()  # not looked at again within its period


@pytest.mark.parametrize("stage", ["encode", "analyze"])
def test_the_bounded_stages_refuse_sdf_rather_than_ignore_it(tmp_path: Path, stage: str) -> None:
    from pipelines import analyze, encode

    job = {"encode": encode, "analyze": analyze}[stage]
    with pytest.raises(ConfigError, match=f"esa {stage} runs bounded: drop --kafka_io sdf"):
        job.run_from_argv(["--spec", SPEC, "--output_dir", str(tmp_path / "out"), "--kafka_io", "sdf",
                           "--stop_after_idle_seconds", "1", "--kafka_bootstrap", "127.0.0.1:1"])


def test_the_streaming_driver_asks_flink_to_finish_bundles_before_checkpoints() -> None:
    """What the portable runner sends the Flink job server: ``finishBundleBeforeCheckpointing`` once the driver
    set it (the stalled read, docs/deployment.md), nothing of it before."""
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    from pipelines.options import finish_bundles_before_checkpoints

    def sent(options: PipelineOptions) -> dict:
        return dict(JobServiceHandle.encode_pipeline_options(options.get_all_options(drop_default=True)))

    options = PipelineOptions(["--runner", "FlinkRunner", "--checkpointing_interval", "2000"])
    assert "beam:option:finish_bundle_before_checkpointing:v1" not in sent(options)
    finish_bundles_before_checkpoints(options)
    assert sent(options)["beam:option:finish_bundle_before_checkpointing:v1"] is True
    assert sent(options)["beam:option:checkpointing_interval:v1"] == "2000"
