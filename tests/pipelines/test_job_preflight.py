"""Configuration is found before a job starts: a bad spec, a misspelt runner or missing keys is one line and
exit 2 or 3 with nothing created; ``--help``, spec errors, ``esa privacy`` and ``esa plan`` import no Beam.

Broker-free: each case is refused before Kafka is asked. The import checks and one refusal per kind run in
real ``esa`` processes (``python -m pipelines.cli``); the variations run ``cli.main`` in-process, which saves a
Beam import (seconds on a loaded machine) per case."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli_parser import DEFAULT_SPEC
from pipelines.job_config import default_keys_dir
from pipelines.job_preflight import keys_dir_of
from transforms.trust.keys import init_keys

REPO = Path(__file__).resolve().parents[2]
JOBS = ("run", "encode", "shuffle", "analyze")
CLOSED = "127.0.0.1:9"  # never asked: every case here is refused first


def _esa(argv: list[str], cwd: Path, importtime: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    flags = ["-X", "importtime"] if importtime else []
    return subprocess.run([sys.executable, *flags, "-m", "pipelines.cli", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _main(argv: list[str], cwd: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> tuple[int, list[str]]:
    """``esa ARGV`` in-process from ``cwd``: (exit code, stderr's non-empty lines)."""
    from pipelines import cli

    monkeypatch.chdir(cwd)
    code = cli.main(argv)
    return code, [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def _error_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [ln for ln in done.stderr.splitlines() if not ln.startswith("import time:") and ln.strip()]


def _imported(done: subprocess.CompletedProcess[str]) -> set[str]:
    """Top-level packages ``-X importtime`` reports as imported."""
    names = [ln.rsplit("|", 1)[-1].strip() for ln in done.stderr.splitlines() if ln.startswith("import time:")]
    return {n.split(".")[0] for n in names}


@pytest.mark.parametrize("argv", [
    *([job, "--help"] for job in JOBS),
    ["privacy", "--mechanism", "grr", "--domain", "64", "--epsilon", "4", "--n", "1000000", "--delta", "1e-6"],
    ["plan", "--kind", "histogram", "--mechanism", "grr", "--d", "64", "--n", "100000", "--delta", "1e-6",
     "--epsilon_central", "1"],
], ids=lambda a: " ".join(a[:2]))
def test_help_privacy_and_plan_import_no_beam(argv: list[str], tmp_path: Path) -> None:
    done = _esa(argv, tmp_path, importtime=True)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = _imported(done)
    assert "pipelines" in imported  # the measurement sees our own imports ...
    assert not imported & {"apache_beam", "pyarrow", "confluent_kafka"}, imported  # ... and none of these


def test_a_spec_error_is_one_line_exit_3_without_beam(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(DEFAULT_SPEC.read_text().replace('kind = "histogram"', 'kind = "histogramm"'))
    assert bad.read_text() != DEFAULT_SPEC.read_text()
    done = _esa(["encode", "--spec", str(bad), "--kafka_bootstrap", CLOSED], tmp_path, importtime=True)
    lines = _error_lines(done)
    assert done.returncode == 3 and len(lines) == 1 and lines[0].startswith("esa encode: error:"), done.stderr[-2000:]
    assert "histogramm" in lines[0] and "apache_beam" not in _imported(done)


def _missing_keys_line(job: str) -> str:
    return (f"esa {job}: error: --keys_dir no-keys: no such directory; create the keys with `python -m "
            "transforms.trust init no-keys` (esa simulate also enrols its devices there), or give --keys_dir of "
            "existing keys")


def test_missing_keys_are_one_line_exit_3_and_nothing_is_created(tmp_path: Path) -> None:
    done = _esa(["encode", "--spec", str(DEFAULT_SPEC), "--kafka_bootstrap", CLOSED, "--output_dir", "out",
                 "--keys_dir", "no-keys"], tmp_path)
    assert done.returncode == 3 and _error_lines(done) == [_missing_keys_line("encode")], done.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []  # no out/, no out.state/ (nor its staging/), no keys


@pytest.mark.parametrize("job", ["run", "shuffle", "analyze"])
def test_missing_keys_in_every_job(job: str, tmp_path: Path, capsys, monkeypatch) -> None:
    code, lines = _main([job, "--spec", str(DEFAULT_SPEC), "--kafka_bootstrap", CLOSED, "--output_dir", "out",
                         "--keys_dir", "no-keys"], tmp_path, capsys, monkeypatch)
    assert code == 3 and lines == [_missing_keys_line(job)]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("job", "missing", "named"), [
    ("encode", "public/analyzer-*", "analyzer public"),
    ("shuffle", "shuffler/*.ed25519", "shuffler signing"),
    ("analyze", "analyzer/*.x25519", "analyzer private"),
    ("analyze", "public/shuffler-*.ed25519.pub", "shuffler public"),
])
def test_each_job_checks_the_keys_it_loads(job: str, missing: str, named: str, tmp_path: Path, capsys,
                                           monkeypatch) -> None:
    keys = tmp_path / "keys"
    init_keys(keys)
    removed = list(keys.glob(missing))
    assert removed
    for path in removed:
        path.unlink()
    code, lines = _main([job, "--spec", str(DEFAULT_SPEC), "--kafka_bootstrap", CLOSED, "--output_dir",
                         str(tmp_path / "out"), "--keys_dir", str(keys)], tmp_path, capsys, monkeypatch)
    assert code == 3 and len(lines) == 1 and named in lines[0], lines
    assert f"python -m transforms.trust init {keys}" in lines[0] and not (tmp_path / "out").exists()


def test_complete_keys_pass_the_check_and_the_job_goes_on_to_kafka(tmp_path: Path, capsys, monkeypatch) -> None:
    """The check is not a refusal of everything: with init's keys the job gets as far as the broker (exit 4)."""
    init_keys(tmp_path / "keys")
    code, lines = _main(["analyze", "--spec", str(DEFAULT_SPEC), "--kafka_bootstrap", CLOSED, "--output_dir",
                         str(tmp_path / "out"), "--keys_dir", str(tmp_path / "keys")], tmp_path, capsys, monkeypatch)
    assert code == 4 and "cannot reach Kafka" in lines[-1], lines


def test_a_misspelt_runner_is_exit_2_before_anything_is_created(tmp_path: Path) -> None:
    init_keys(tmp_path / "keys")
    work = tmp_path / "work"
    work.mkdir()
    done = _esa(["encode", "--spec", str(DEFAULT_SPEC), "--kafka_bootstrap", CLOSED, "--output_dir", "out",
                 "--keys_dir", str(tmp_path / "keys"), "--runner", "DirectRuner"], work)
    lines = _error_lines(done)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("esa encode: error: --runner DirectRuner: not a Beam runner (did you mean "
                               "DirectRunner?)")
    assert list(work.iterdir()) == []


@pytest.mark.parametrize(("runner", "hint"), [("flinkrunner2", "did you mean FlinkRunner?"),
                                               ("no.such.module.Runner", "no class Runner in an importable")])
def test_other_bad_runners(runner: str, hint: str, tmp_path: Path, capsys, monkeypatch) -> None:
    init_keys(tmp_path / "keys")
    work = tmp_path / "work"
    work.mkdir()
    code, lines = _main(["shuffle", "--spec", str(DEFAULT_SPEC), "--output_dir", "out", "--keys_dir",
                         str(tmp_path / "keys"), "--runner", runner], work, capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and hint in lines[0], lines
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("runner", ["DirectRunner", "directrunner", "Prism", "FnApiRunner",
                                    "apache_beam.runners.direct.direct_runner.DirectRunner"])
def test_runner_names_beam_accepts_pass(runner: str) -> None:
    from pipelines.job_preflight import check_runner

    check_runner(runner)


@pytest.mark.parametrize("out", ["out", "a/b/out", "/tmp/x/out/"])
def test_the_default_keys_dir_is_the_jobs(out: str) -> None:
    assert keys_dir_of(["--output_dir", out]) == default_keys_dir(Path(out))
    assert keys_dir_of(["--output_dir", out, "--keys_dir", "k"]) == Path("k")
    assert keys_dir_of(["--output_dir", "gs://bucket/out"]) is None  # a URL output is refused later, by the job

