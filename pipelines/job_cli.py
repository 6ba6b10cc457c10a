"""Command-line handling of the Beam job subcommands (``esa run|encode|shuffle|analyze``).

Beam parses the job flags itself and silently drops what it does not know, so a typo (``--outputdir``,
``--kafka_bootsrap``) used to fall back to a default and exit 0. Here the flags are checked first against
every option class Beam has registered (ours in ``pipelines.options`` and Beam's own: runner, worker,
portability, ...), found dynamically so that new ``pipelines.options`` flags need no change here. Hyphen
spellings of esa flags (``--kafka-bootstrap``) are accepted and rewritten to the canonical underscores.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.exit_codes import ExitCode

MAX_DEAD_LETTER_FRACTION = 0.1
BEAM_NOTE = ("Beam pipeline options (--runner, --project, --temp_location, --experiments, --direct_num_workers, "
             "...) pass through to Beam unchanged; any other flag is refused. Without --runner the job runs "
             "locally on Beam's FnApiRunner.")


class UsageError(Exception):
    """A bad job command line: one line for the user, exit code 2."""

    exit_code = ExitCode.USAGE


def _option_classes(module_only: bool) -> list[type]:
    """PipelineOptions subclasses: those of ``pipelines.options`` only, or every one Beam knows."""
    from apache_beam.options.pipeline_options import PipelineOptions

    import pipelines.options as esa_options

    if module_only:
        return [cls for _, cls in inspect.getmembers(esa_options, inspect.isclass)
                if issubclass(cls, PipelineOptions) and cls is not PipelineOptions
                and cls.__module__ == esa_options.__name__]
    seen: dict[str, type] = {}
    todo = list(PipelineOptions.__subclasses__())
    while todo:
        cls = todo.pop()
        if str(cls) not in seen:
            seen[str(cls)] = cls
            todo.extend(cls.__subclasses__())
    return list(seen.values())


def _beam_parser(prog: str, classes: Sequence[type]) -> argparse.ArgumentParser:
    from apache_beam.options.pipeline_options import _BeamArgumentParser

    parser = _BeamArgumentParser(prog=prog, allow_abbrev=False, add_help=False)
    for cls in classes:
        try:
            cls._add_argparse_args(parser)
        except argparse.ArgumentError:  # the same flag defined by two classes (as Beam, keep the first)
            continue
    return parser


def esa_flags() -> list[str]:
    """Long flags of the esa option classes (``pipelines.options``)."""
    parser = _beam_parser("esa", _option_classes(module_only=True))
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


def known_flags() -> list[str]:
    """Every long flag of every registered PipelineOptions class (ours and Beam's)."""
    parser = _beam_parser("esa", _option_classes(module_only=False))
    return sorted(s for a in parser._actions for s in a.option_strings if s.startswith("--"))


class _DefaultsFormatter(argparse.HelpFormatter):
    """Appends an option's default to its help, unless the help already says it or there is none to say."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default is None or default is False or default in ("", [], argparse.SUPPRESS):
            return text
        return f"{text} (default {default})".replace("%", "%%")


def help_text(command: str, what: str) -> str:
    """``esa COMMAND --help``: the esa flags this job uses (``pipelines.job_flags``), the Beam flags most asked
    for, and the Beam note. Beam is not imported: a ``--help`` answers at once."""
    from pipelines.job_flags import RUNNERS_HELP, WINDOWED, esa_parser

    parser = esa_parser(f"esa {command}", command, description=what, epilog=BEAM_NOTE,
                        usage=f"esa [-v] {command} --spec F.toml [esa options] [Beam options]",
                        formatter_class=_DefaultsFormatter)
    beam = parser.add_argument_group("Beam (every other Beam pipeline option passes through)")
    beam.add_argument("--runner", default=None, help=RUNNERS_HELP)
    if command in WINDOWED:
        beam.add_argument("--streaming", action="store_true",
                          help="one unbounded pipeline: the streaming shuffler only (--kafka_io sdf on PrismRunner, "
                               "FlinkRunner or DataflowRunner)")
    cli = parser.add_argument_group("esa command")
    cli.add_argument("--max_dead_letter_fraction", type=float, default=MAX_DEAD_LETTER_FRACTION,
                     help="exit with code 6 (after a loud warning) when more than this fraction of the records "
                          f"read is dead-lettered (default {MAX_DEAD_LETTER_FRACTION})")
    cli.add_argument("-v", "--verbose", action="store_true", help="log the project's debug details (not Beam's)")
    cli.add_argument("--log_format", choices=("text", "json"), default=None,
                     help="text (default) or json: one JSON object per log line (default $ESA_LOG_FORMAT or text)")
    return parser.format_help()


@dataclass(frozen=True)
class JobArgs:
    """A checked job command line: the flags for Beam and the esa command's own settings."""

    beam_argv: list[str]
    max_dead_letter_fraction: float
    help: bool = False


def canonical(token: str, flags: set[str]) -> str:
    """``--kafka-bootstrap[=v]`` -> ``--kafka_bootstrap[=v]`` when the underscore form is a known flag."""
    if not token.startswith("--") or "-" not in token[2:].split("=", 1)[0]:
        return token
    name, sep, value = token.partition("=")
    underscored = "--" + name[2:].replace("-", "_")
    return underscored + sep + value if underscored in flags else token


def _suggest(flag: str, flags: Sequence[str]) -> str:
    close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def wants_help(argv: Sequence[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def parse_job_argv(command: str, argv: Sequence[str]) -> JobArgs:
    """Check a job's flags (UsageError naming the first unknown one and the closest known flag) and split off
    the esa command's own (``--max_dead_letter_fraction``)."""
    args = list(argv)
    if wants_help(args):
        return JobArgs([], MAX_DEAD_LETTER_FRACTION, help=True)
    flags = set(known_flags()) | {"--max_dead_letter_fraction"}
    args = [canonical(a, flags) for a in args]
    fraction = MAX_DEAD_LETTER_FRACTION
    rest: list[str] = []
    i = 0
    while i < len(args):
        token = args[i]
        if token == "--max_dead_letter_fraction" or token.startswith("--max_dead_letter_fraction="):
            if "=" in token:
                text = token.split("=", 1)[1]
            elif i + 1 < len(args):
                i += 1
                text = args[i]
            else:
                raise UsageError("--max_dead_letter_fraction needs a value in [0, 1]")
            try:
                fraction = float(text)
            except ValueError:
                raise UsageError(f"--max_dead_letter_fraction must be a number in [0, 1], got {text!r}") from None
            if not 0.0 <= fraction <= 1.0:
                raise UsageError(f"--max_dead_letter_fraction must lie in [0, 1], got {fraction:g}")
        else:
            rest.append(token)
        i += 1
    parser = _beam_parser(f"esa {command}", _option_classes(module_only=False))
    _, unknown = parser.parse_known_args(rest)
    for token in unknown:
        if token.startswith("-"):
            flag = token.split("=", 1)[0]
            raise UsageError(f"unknown flag {flag}{_suggest(flag, sorted(flags))}; see esa {command} --help")
        raise UsageError(f"unexpected argument {token!r} (job flags take the form --name value); "
                         f"see esa {command} --help")
    return JobArgs(rest, fraction)


def dead_letter_verdict(accounting: dict[str, int], max_fraction: float) -> tuple[float, str | None]:
    """(fraction of the records read that were dead-lettered, a loud warning if it exceeds ``max_fraction``)."""
    read, dead = int(accounting.get("read", 0)), int(accounting.get("dead_lettered", 0))
    fraction = dead / read if read else 0.0
    if fraction <= max_fraction:
        return fraction, None
    return fraction, (f"WARNING: {dead:,} of {read:,} records read ({100 * fraction:.1f}%) were dead-lettered, more "
                      f"than --max_dead_letter_fraction {max_fraction:g} allows: look at the reasons in the dead "
                      f"letters (wrong --spec? wrong topic? a producer's bug?); exit code {int(ExitCode.DEAD_LETTERS)}")
