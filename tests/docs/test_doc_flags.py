"""Every flag README.md and docs/*.md name is a flag that exists, and the README's command table names each
command's own flags (broker-free, in-process). A removed or renamed flag left in the docs fails here."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pipelines import cli_parser
from pipelines.job_cli import known_flags
from tests.docs.readme_commands import README, REPO

DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
JOBS = ("run", "encode", "shuffle", "analyze")
# Flags of other programs the docs quote, each with the file that must hold it (benchmarks) or the program.
OTHER_PROGRAMS = {
    "--repeats": REPO / "benchmarks" / "pipeline.py",
    "--mechanisms": REPO / "benchmarks" / "pipeline.py",
    "--jobs_only": REPO / "benchmarks" / "profile_summary.py",
    "--large": REPO / "benchmarks" / "shuffle_rest_leak.py",
    "--trees": REPO / "benchmarks" / "shuffle_ab.py",
    "--stages": REPO / "benchmarks" / "shuffle_ab.py",
    "--registry": REPO / "benchmarks" / "shuffle_ab.py",
    "--stress": REPO / "benchmarks" / "shuffle_ab.py",
    "--no_raw_rates": REPO / "benchmarks" / "pipeline.py",
    "--subprocesses": "py-spy record",
    "--dist": "pytest-xdist",
    "--flink-master": "Flink job server image",
    "--net": "docker run",
    "--worker_pool": "Beam SDK harness image",
    "--staging-location": "gcloud dataflow flex-template run",
    "--rest-port": REPO / "pipelines" / "flink_cluster.py",
    "--slots": REPO / "pipelines" / "flink_cluster.py",
    "--taskmanagers": REPO / "pipelines" / "flink_cluster.py",
    "--taskmanager-memory": REPO / "pipelines" / "flink_cluster.py",
    "--service_port": "Beam's worker_pool_main",
    "--election-type": "Apache Kafka's kafka-leader-election tool",
    "--legacy_registry": REPO / "transforms" / "trust" / "__main__.py",
    "--bulk": REPO / "benchmarks" / "registry_scale.py",
    "--phase": REPO / "benchmarks" / "registry_scale.py",
    "--increment": REPO / "benchmarks" / "registry_scale.py",
    "--lookups": REPO / "benchmarks" / "registry_scale.py",
    **{flag: REPO / "benchmarks" / "edge_load.py" for flag in ("--requests", "--concurrency", "--idle_connections",
                                                                    "--servers")},
    **{flag: REPO / "pipelines" / "flink_job_server.py" for flag in ("--add-opens", "--job-host", "--watch-stdin",
                                                                      "--work-dir")},
    **{flag: REPO / "pipelines" / "harness_boot.py" for flag in ("--id", "--provision_endpoint", "--control_endpoint",
                                                                  "--logging_endpoint", "--semi_persist_dir")},
    **{flag: "kafka-acls.sh" for flag in ("--add", "--allow-principal", "--bootstrap-server", "--command-config",
                                          "--group", "--operation", "--resource-pattern-type", "--topic",
                                          "--transactional-id")},
}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*[a-z0-9]")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")  # anchors such as #streaming-...---kafka_io-sdf are not flags


def _native_parsers() -> dict[str, argparse.ArgumentParser]:
    for action in cli_parser.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {name: sub for name, sub in action.choices.items() if name not in JOBS}
    raise AssertionError("esa has no subcommands")


def _flags_of(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


@pytest.fixture(scope="module")
def command_flags() -> dict[str, set[str]]:
    jobs = set(known_flags()) | {"--max_dead_letter_fraction", "--help"}
    return {**{name: _flags_of(p) for name, p in _native_parsers().items()}, **{job: jobs for job in JOBS},
            "esa": _flags_of(cli_parser.build_parser())}  # global flags (-v, --log_format), before or after


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_flag_the_docs_name_exists(doc: Path, command_flags: dict[str, set[str]]) -> None:
    known = set().union(*command_flags.values())
    text = _LINK_TARGET.sub("]", doc.read_text(encoding="utf-8"))
    unknown = []
    for flag in sorted(set(_FLAG.findall(text))):
        underscored = "--" + flag[2:].replace("-", "_")  # hyphens are accepted for every esa flag
        if flag in known or underscored in known:
            continue
        other = OTHER_PROGRAMS.get(flag)
        if isinstance(other, Path):
            assert flag in other.read_text(encoding="utf-8"), (flag, other)
        elif other is None:
            unknown.append(flag)
    assert not unknown, f"{doc.name} names flags no esa command has: {unknown}"


def test_readme_command_table_names_each_commands_own_flags(command_flags: dict[str, set[str]]) -> None:
    rows = re.findall(r"^\| `esa ([\w-]+)([^|]*(?:\\\|[^|]*)*)` \|", README.read_text(encoding="utf-8"),
                      re.MULTILINE)
    assert {name for name, _ in rows} >= set(command_flags) - {"encode", "shuffle", "analyze", "esa"}
    for name, usage in rows:
        wrong = sorted(set(_FLAG.findall(usage)) - command_flags[name])
        assert not wrong, f"the README's `esa {name}` row names flags it does not take: {wrong}"
