"""What can be checked of the deployment files without Docker, Flink or a cloud account.

Images cannot be built here and no Flink cluster or Dataflow project is reachable, so these tests lint the
files against the code they deploy: the harness image's Beam and Python versions equal the ones installed
(a mismatched harness refuses the job), the Flex Template's parameters are real flags of the esa jobs, and
every ``--flag`` the example scripts pass is an option Beam or esa actually defines (an unknown flag is
silently ignored by Beam's option parser, so a typo would only surface on the cluster).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import apache_beam
import pytest
from apache_beam.options.pipeline_options import FlinkRunnerOptions, PipelineOptions

from pipelines.options import EsaKafkaOptions, EsaOptions, EsaServiceOptions

ROOT = Path(__file__).resolve().parents[2]
DATAFLOW, FLINK = ROOT / "deploy" / "dataflow", ROOT / "deploy" / "flink"
SCRIPTS = sorted([*DATAFLOW.glob("*.sh"), *FLINK.glob("*.sh")])
ESA_SCRIPTS = [p for p in SCRIPTS if "exec esa run" in p.read_text()]


def _esa_flags() -> set[str]:
    parser = argparse.ArgumentParser()
    EsaKafkaOptions._add_argparse_args(parser)
    EsaOptions._add_argparse_args(parser)
    EsaServiceOptions._add_argparse_args(parser)
    return {a.dest for a in parser._actions if a.dest != "help"}


def _from_lines(dockerfile: Path) -> list[str]:
    return [line.split()[1] for line in dockerfile.read_text().splitlines() if line.startswith("FROM ")]


def test_harness_image_matches_installed_beam_and_python() -> None:
    images = _from_lines(ROOT / "Dockerfile")
    assert len(images) == 1, images
    match = re.fullmatch(r"apache/beam_python(\d+)\.(\d+)_sdk:(\S+)", images[0])
    assert match, images[0]
    assert (int(match[1]), int(match[2])) == sys.version_info[:2]
    assert match[3] == apache_beam.__version__


def test_harness_image_copies_every_package_directory() -> None:
    text = (ROOT / "Dockerfile").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r'include = \[([^\]]*)\]', pyproject)[1]
    for name in re.findall(r'"(\w+)\*"', packages):
        assert f"COPY {name} ./{name}" in text, name
    assert "pip install" in text and "--constraint" in text


def test_flex_template_metadata_names_real_flags() -> None:
    metadata = json.loads((DATAFLOW / "metadata.json").read_text())
    assert metadata["name"] and metadata["description"]
    names = [p["name"] for p in metadata["parameters"]]
    assert len(names) == len(set(names))
    assert set(names) <= _esa_flags(), set(names) - _esa_flags()
    required = {p["name"] for p in metadata["parameters"] if not p.get("isOptional", False)}
    assert {"spec", "kafka_bootstrap"} <= required
    for p in metadata["parameters"]:
        for regex in p.get("regexes", []):
            re.compile(regex)


def test_flex_template_regexes_accept_the_examples() -> None:
    params = {p["name"]: p for p in json.loads((DATAFLOW / "metadata.json").read_text())["parameters"]}
    samples = {"spec": "/opt/esa-telemetry/examples/app_language.toml", "kafka_bootstrap": "k1:9092,k2:9093",
               "kafka_io": "xlang"}
    for name, value in samples.items():
        assert all(re.fullmatch(r, value) for r in params[name].get("regexes", [])), name
    assert not re.fullmatch(params["kafka_io"]["regexes"][0], "java")


def test_flex_launcher_runs_the_entry_point_it_copies() -> None:
    text = (DATAFLOW / "Dockerfile").read_text()
    py_file = re.search(r"FLEX_TEMPLATE_PYTHON_PY_FILE=(\S+)", text)[1]
    copied = re.search(r"COPY (deploy/dataflow/main\.py) (\S+)", text)
    assert copied and copied[2] == py_file
    assert (ROOT / copied[1]).is_file()
    assert "openjdk" in text  # the xlang KafkaIO expansion service runs on the launcher


def _known_options() -> set[str]:
    return set(PipelineOptions([]).get_all_options(retain_unknown_options=False)) | _esa_flags()


@pytest.mark.parametrize("script", ESA_SCRIPTS, ids=lambda p: p.name)
def test_example_scripts_pass_only_known_flags(script: Path) -> None:
    flags = set(re.findall(r"^\s*--([a-z_]+)=", script.read_text(), flags=re.MULTILINE))
    assert flags, script
    assert flags <= _known_options(), flags - _known_options()


def test_template_launch_passes_only_known_parameters() -> None:
    text = (DATAFLOW / "build_template.sh").read_text()
    names = set(re.findall(r"--parameters=([a-z_]+)=", text))
    assert {"spec", "kafka_bootstrap"} <= names
    assert names <= _known_options(), names - _known_options()


def test_flink_job_server_image_matches_beam_and_a_published_flink() -> None:
    text = (FLINK / "run_portable.sh").read_text()
    flink, beam = re.search(r"apache/beam_flink(\d+\.\d+)_job_server:(\S+)", text).groups()
    assert beam == apache_beam.__version__
    assert flink in FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS


@pytest.mark.parametrize("script", ESA_SCRIPTS, ids=lambda p: p.name)
def test_cluster_scripts_stage_where_the_workers_can_write(script: Path) -> None:
    """Workers on Dataflow or Flink cannot write the driver's disk: every cluster script names a staging
    location (Dataflow's is the bucket), and Dataflow's driver keeps running on its own persistent state."""
    text = script.read_text()
    assert re.search(r"^\s*--staging_location=", text, flags=re.MULTILINE), script
    if "DataflowRunner" in text:
        assert re.search(r'--staging_location="\$BUCKET/', text)
        assert "--state_dir=" in text and "--follow" in text
