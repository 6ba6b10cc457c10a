"""What `esa --help` and the job helps say matches what the code does (broker-free, in-process)."""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path

import pytest

from pipelines import cli, cli_parser, end_to_end
from pipelines.demo.population import DISTRIBUTIONS
from pipelines.demo.run import DEMO_SPECS
from pipelines.job_cli import _beam_parser, _option_classes, help_text
from pipelines.job_config import default_keys_dir, default_state_dir
from pipelines.job_flags import GROUPS, JOBS, esa_parser, flags_of


def _flat(text: str) -> str:
    """Help text with its line wrapping undone."""
    return " ".join(text.split())


def test_run_is_described_as_the_three_jobs_in_the_order_it_runs_them(capsys) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = _flat(capsys.readouterr().out)
    assert "one pipeline" not in out
    described = re.search(r"run the three jobs \(([a-z, ]+)\) one after another", out)
    assert described is not None, out
    source = inspect.getsource(end_to_end.run)
    called = re.findall(r'summary\.stages\["(\w+)"\] = (\w+)\.run\(', source)
    assert [stage for stage, _ in called] == [name for name, _ in called]  # each stage is its own job module
    assert described.group(1).split(", ") == [stage for stage, _ in called]


def test_literal_choices_are_the_demo_modules_own() -> None:
    """cli keeps them literal (no Beam import for `esa privacy`): they must not drift from pipelines.demo."""
    assert cli_parser.DISTRIBUTIONS == DISTRIBUTIONS
    assert tuple(DEMO_SPECS) == cli_parser.DEMO_KINDS


@pytest.mark.parametrize("command", JOBS)
def test_job_help_states_each_default_the_parser_uses(command: str) -> None:
    out = _flat(help_text(command, "what"))
    parser = esa_parser("esa", command)
    stated = 0
    for action in parser._actions:
        default = action.default
        if default is None or default is False or default in ("", [], argparse.SUPPRESS):
            continue
        flag = action.option_strings[0]
        shown = "{" + ",".join(action.choices) + "}" if action.choices else action.metavar or action.dest.upper()
        entry = out.split(f" {flag} {shown} ", 1)[1].split(f" {flag}", 1)[0][:600]
        if "default" not in (action.help or ""):  # a default the help words itself is audited by hand
            assert f"(default {default})" in entry, (flag, entry)
            stated += 1
    assert stated >= 5


@pytest.mark.parametrize("command", JOBS)
def test_each_job_help_lists_its_own_flags_only(command: str) -> None:
    """The encoder's help has no windowing, Flink or streaming flags; the shuffler's has them; each lists
    exactly the flags ``pipelines.job_flags`` says it uses."""
    out = help_text(command, "what")
    listed = set(re.findall(r"^  (?:-\w, )?(--[a-z_]+)", out, re.MULTILINE))
    cli_flags = {"--help", "--runner", "--max_dead_letter_fraction", "--log_format", "--verbose"}
    assert listed == {*flags_of(command), *cli_flags, *(["--streaming"] if command in ("run", "shuffle") else [])}
    windowed = {"--drain", "--out_of_orderness_seconds", "--checkpointing_interval", "--kafka_io", "--streaming"}
    if command in ("run", "shuffle"):
        assert windowed <= listed, windowed - listed
    else:
        assert not windowed & listed, windowed & listed


def test_the_flag_table_is_what_beam_registers() -> None:
    """``pipelines.options`` registers exactly the flags of ``pipelines.job_flags``, class by class, with the
    same defaults: the help (from the table, no Beam) cannot drift from what the jobs parse."""
    classes = {cls.__name__: cls for cls in _option_classes(module_only=True)}
    assert set(classes) == set(GROUPS)
    for name, (_, flags) in GROUPS.items():
        registered = _beam_parser("esa", [classes[name]])
        actions = {a.option_strings[0]: a for a in registered._actions if a.option_strings}
        assert set(actions) == {f.name for f in flags}, name
        for flag in flags:
            assert actions[flag.name].default == flag.kwargs.get("default", actions[flag.name].default), flag.name


def test_state_and_keys_defaults_in_the_help_are_where_the_jobs_put_them() -> None:
    out = _flat(help_text("encode", "what"))
    out_dir = Path("OUTPUT_DIR")
    assert f"(default: {default_state_dir(out_dir)}, beside the output directory" in out
    assert f"(default: {default_keys_dir(out_dir)}, beside the output directory)" in out
    assert "OUTPUT_DIR/state" not in out and "OUTPUT_DIR/keys" not in out


def test_simulate_and_demo_refuse_negative_bad_record_counts(capsys) -> None:
    for argv in (["simulate", "--bootstrap", "h:1", "--bad_per_kind", "-1"], ["demo", "--bad_per_kind", "-2"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 2 and "must be >= 0" in capsys.readouterr().err
