"""The ``esa`` command is helpful (every --help lists its flags) and strict (unknown flags are refused with the
closest known one), prints only what it wrote, and fails loudly on mostly dead-lettered runs. In-process and
broker-free, except the one BrokenPipe subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

import pipelines.options as esa_options
from pipelines import cli, cli_parser
from pipelines.exit_codes import ExitCode, epilog
from pipelines.job_cli import esa_flags, known_flags, parse_job_argv
from pipelines.job_flags import flags_of

JOBS = ("run", "encode", "shuffle", "analyze")
DEMO_SPEC = cli_parser.DEFAULT_SPEC
NATIVE = {  # command -> flags its --help must list (underscore spelling)
    "broker": ["--port"],
    "simulate": ["--bootstrap", "--spec", "--clients", "--raw_topic", "--reports_topic", "--bad_per_kind", "--zipf_s",
                 "--start_time", "--seed", "--kafka_client"],
    "demo": ["--clients", "--kind", "--mechanism", "--epsilon", "--out", "--spec", "--bad_per_kind", "--seed"],
    "query": ["--estimates", "--range", "--quantile", "--spec_id", "--window", "--crowd", "--json"],
    "privacy": ["--mechanism", "--domain", "--epsilon", "--n", "--delta", "--epsilon_fragment", "--json"],
    "plan": ["--kind", "--d", "--n", "--epsilon_central", "--delta", "--t_rule", "--k_round"],
}


def run_main(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    try:
        code = cli.main(argv)
    except SystemExit as stop:  # argparse's --help and usage errors
        code = stop.code
    out = capsys.readouterr()
    return int(code or 0), out.out, out.err


@pytest.mark.parametrize("command", sorted(NATIVE))
def test_native_help_lists_every_flag(command: str, capsys) -> None:
    code, out, _ = run_main([command, "--help"], capsys)
    assert code == 0
    for flag in NATIVE[command]:
        assert flag in out, flag
    assert "--raw-topic" not in out and "--epsilon-" not in out  # one (underscore) style in help


@pytest.mark.parametrize("command", JOBS)
def test_job_help_lists_the_esa_options_and_the_beam_note(command: str, capsys) -> None:
    code, out, _ = run_main([command, "--help"], capsys)
    assert code == 0
    flags = flags_of(command)
    assert {"--spec", "--kafka_bootstrap", "--output_dir", "--keys_dir"} <= set(flags)
    for flag in [*flags, "--max_dead_letter_fraction"]:
        assert flag in out, flag
    assert "pass through to Beam" in out


def test_every_job_flag_is_accepted_by_every_job() -> None:
    """A flag left out of a job's help (``--drain`` for the encoder) is still accepted, as Beam accepts it."""
    for command in JOBS:
        assert set(esa_flags()) <= set(known_flags())
        assert parse_job_argv(command, ["--drain", "--raw-topic", "t"]).beam_argv == ["--drain", "--raw_topic", "t"]


@pytest.mark.parametrize(("argv", "suggestion"), [
    (["run", "--kafka_bootsrap", "10.0.0.1:9092"], "--kafka_bootstrap"),
    (["analyze", "--outputdir", "/tmp/x"], "--output_dir"),
    (["encode", "--spec", str(DEMO_SPEC), "--runer", "DataflowRunner"], "--runner"),
    (["shuffle", "--shuffled-topik", "s"], "--shuffled_topic"),
])
def test_job_typos_are_refused_with_the_closest_flag(argv, suggestion, capsys) -> None:
    code, out, err = run_main(argv, capsys)
    assert code == ExitCode.USAGE and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"did you mean {suggestion}?" in lines[0], err


def test_job_flags_beam_knows_pass_and_hyphens_are_canonical() -> None:
    job = parse_job_argv("run", ["--kafka-bootstrap=h:1", "--runner", "DirectRunner", "--direct_num_workers", "2",
                                 "--max_dead_letter_fraction", "0.5", "--experiments", "a"])
    assert job.beam_argv == ["--kafka_bootstrap=h:1", "--runner", "DirectRunner", "--direct_num_workers", "2",
                             "--experiments", "a"]
    assert job.max_dead_letter_fraction == 0.5
    assert {"--runner", "--project", "--temp_location"} <= set(known_flags())


REQUIRED = {"simulate": ["--bootstrap", "b:1"], "query": ["--estimates", "d"],
            "privacy": ["--mechanism", "grr", "--domain", "4", "--epsilon", "1", "--n", "10", "--delta", "1e-6"],
            "plan": ["--kind", "vector_mean", "--d", "4", "--n", "100", "--epsilon_central", "1", "--delta", "1e-6"]}


@pytest.mark.parametrize("command", [*sorted(NATIVE), *JOBS])
def test_every_command_refuses_an_unknown_flag(command: str, capsys) -> None:
    code, _, err = run_main([command, *REQUIRED.get(command, []), "--no_such_flag_at_all", "1"], capsys)
    assert code == ExitCode.USAGE and "unknown flag --no_such_flag_at_all" in err


def test_native_typo_names_the_closest_flag_and_hyphens_work(capsys) -> None:
    code, _, err = run_main(["demo", "--clinets", "3"], capsys)
    assert code == ExitCode.USAGE and "did you mean --clients?" in err
    args = cli_parser.parse_native(["simulate", "--bootstrap", "b:1", "--raw-topic", "t", "--zipf-s=1.3", "--raw_topic",
                              "u", "--bad-per-kind", "2"])
    assert (args.raw_topic, args.zipf_s, args.bad_per_kind) == ("u", 1.3, 2)


@pytest.mark.parametrize("argv", [["-v", "run", "--help"], ["run", "-v", "--help"], ["--verbose", "plan", "--help"],
                                  ["plan", "--help", "--verbose"]])
def test_verbose_before_or_after_the_subcommand(argv, capsys) -> None:
    code, out, _ = run_main(argv, capsys)
    assert code == 0 and "usage:" in out


def test_help_epilog_documents_every_exit_code(capsys) -> None:
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    for member in ExitCode:
        assert f"{member.value}  {member.name}" in out and f"{member.value}  {member.name}" in epilog()


def test_topics_default_to_what_simulate_writes() -> None:
    """`esa simulate` then `esa run` with no topic flags must meet on the same topics."""
    kafka = PipelineOptions([]).view_as(esa_options.EsaKafkaOptions)
    simulate = cli_parser.parse_native(["simulate", "--bootstrap", "h:1"])
    assert (kafka.raw_topic, kafka.reports_topic) == (simulate.raw_topic, simulate.reports_topic)


def _job_flags(tmp_path: Path) -> list[str]:
    """A spec and a keys directory that pass the jobs' checks before the (faked) pipeline."""
    from transforms.trust.keys import init_keys

    init_keys(tmp_path / "keys")
    return ["--spec", str(DEMO_SPEC), "--keys_dir", str(tmp_path / "keys"), "--output_dir", str(tmp_path / "o")]


def _fake_job(monkeypatch, module: str, stage: str, accounting: dict[str, int], tmp_path: Path) -> None:
    import importlib

    summary = SimpleNamespace(stage=stage, accounting=accounting, balanced=True,
                              estimates_path=tmp_path / "estimates", dead_letters_path=tmp_path / "dead_letters",
                              records_read_and_dead=lambda: (accounting["read"], accounting["dead_lettered"]))
    monkeypatch.setattr(importlib.import_module(module), "run_from_argv", lambda argv: summary)


@pytest.mark.parametrize(("command", "module", "stage", "writes_estimates"), [
    ("encode", "pipelines.encode", "encode", False), ("shuffle", "pipelines.shuffle", "shuffle", False),
    ("analyze", "pipelines.analyze", "analyze", True), ("run", "pipelines.end_to_end", "end_to_end", True)])
def test_jobs_print_only_what_they_write(command, module, stage, writes_estimates, monkeypatch, tmp_path,
                                         capsys) -> None:
    _fake_job(monkeypatch, module, stage, {"read": 100, "dead_lettered": 2}, tmp_path)
    code, out, _ = run_main([command, *_job_flags(tmp_path)], capsys)
    result = json.loads(out)
    assert code == 0 and result["dead_letters"].endswith("dead_letters")
    assert ("estimates" in result) is writes_estimates


def test_mostly_dead_lettered_run_exits_6_loudly(monkeypatch, tmp_path, capsys) -> None:
    _fake_job(monkeypatch, "pipelines.end_to_end", "end_to_end", {"read": 1000, "dead_lettered": 690}, tmp_path)
    code, out, err = run_main(["run", *_job_flags(tmp_path)], capsys)
    assert code == ExitCode.DEAD_LETTERS == 6
    assert json.loads(out)["dead_letter_fraction"] == pytest.approx(0.69)
    assert "WARNING" in err and "69.0%" in err
    code, _, _ = run_main(["run", *_job_flags(tmp_path), "--max_dead_letter_fraction", "0.7"], capsys)
    assert code == 0
    code, _, err = run_main(["run", "--max_dead_letter_fraction", "2"], capsys)
    assert code == ExitCode.USAGE and "[0, 1]" in err


def test_json_piped_to_a_closed_reader_exits_quietly() -> None:
    """``esa privacy --json | head -0``: the reader is gone before the command writes; no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "privacy", "--mechanism", "grr", "--domain", "10",
                             "--epsilon", "2", "--n", "10000", "--delta", "1e-4", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_beam_command_is_quiet_in_a_fresh_process() -> None:
    """Importing Beam logs an 'apitools not found' warning on every command; the user sees only the error."""
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "encode", "--kafka_bootsrap", "h:1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == ExitCode.USAGE
    assert done.stderr.strip().splitlines() == [
        "esa encode: error: unknown flag --kafka_bootsrap (did you mean --kafka_bootstrap?); see esa encode --help"]
