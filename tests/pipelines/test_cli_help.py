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
from pipelines.job_cli import _beam_parser, _group_title, _option_classes, help_text
from pipelines.job_config import default_keys_dir, default_state_dir

JOBS = ("run", "encode", "shuffle", "analyze")


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
    parser = _beam_parser("esa", _option_classes(module_only=True))
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
    assert stated >= 10


def test_state_and_keys_defaults_in_the_help_are_where_the_jobs_put_them() -> None:
    out = _flat(help_text("encode", "what"))
    out_dir = Path("OUTPUT_DIR")
    assert f"(default: {default_state_dir(out_dir)}, beside the output directory" in out
    assert f"(default: {default_keys_dir(out_dir)}, beside the output directory)" in out
    assert "OUTPUT_DIR/state" not in out and "OUTPUT_DIR/keys" not in out


@pytest.mark.parametrize("cls", _option_classes(module_only=True), ids=lambda c: c.__name__)
def test_option_group_titles_are_whole_sentences(cls: type) -> None:
    """A title is the docstring's first sentence, wherever its first line ends."""
    title = _group_title(cls)
    doc = _flat(inspect.getdoc(cls) or "").replace("``", "`")
    sentence = title.removeprefix(f"{cls.__name__}: ")
    assert doc.startswith(sentence + ".") and (doc == sentence + "." or doc[len(sentence) + 1] == " ")
    assert title in help_text("encode", "what")


def test_simulate_and_demo_refuse_negative_bad_record_counts(capsys) -> None:
    for argv in (["simulate", "--bootstrap", "h:1", "--bad_per_kind", "-1"], ["demo", "--bad_per_kind", "-2"]):
        with pytest.raises(SystemExit) as stop:
            cli.main(argv)
        assert stop.value.code == 2 and "must be >= 0" in capsys.readouterr().err
