"""The streaming shuffler's record accounting when the runner's counters are not the whole story.

The rule is the bounded jobs': every record consumed is accounted for, as a set released, deleted by the crowd
threshold, dead-lettered, an exact copy, a re-read, or held in an open window. In process the runner's counters
are complete and the driver checks the rule on them (``pipelines.stream_shuffle``). A Flink job that restarted
from a checkpoint (a TaskManager died), or was resumed from a savepoint, reports counters of its *last attempt*
only: what the earlier attempts read and decided is gone from them, so the check would fail on a run whose
releases are right (measured: ``read: 0`` after a TaskManager kill). Then the terms come from durable facts:

* **consumed**: the records between the offsets the source started from (the group's committed offsets, else
  the partitions' beginnings, when this *lineage* began; see below) and the group's committed offsets at the
  end, counted by reading that range read_committed (commit markers and aborted records are not records);
* **decided** (released + deleted): the sets counted into each window's threshold decision, staged by the
  workers with every release part (``ReleasePart.sets_in``) and summed by the release agent for each window it
  sealed, once, however often a restarted job stages it again;
* **dead-lettered**: the dead letters the agent collected, each once by its content-derived name;
* exact copies and re-reads are counted by the runner only: the last attempt's counts are used, so a failover
  that lost some makes the run fail the check (exit 1), never pass it wrongly.

A **lineage** is one streaming job and the jobs resumed from its savepoints: ``STATE/stream_lineage.json`` holds
where it started and what its suspended runs accounted for, so the run that finally drains it checks the rule
over the whole lineage. It also names the run key of the driver that is live (``live``): a driver killed
mid-run (SIGKILL) accounts for nothing itself, so the driver that stops its orphaned job into a savepoint and
resumes it (``pipelines.stream_orphan``) carries the dead run's part from what it left durably (``adopt``): the
decided and released sets of the windows it sealed (their ledger entries, under its run key) and the dead
letters it collected (the counts files named by its run key). Its exact copies and re-reads died with it: if
it had any, the check fails (exit 1), never passes wrongly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.exit_codes import JobUsageError
from pipelines.job_config import JobConfig
from transforms.io.kafka.bounded import count_records
from transforms.io.kafka.clients import consumer
from transforms.io.kafka.planning import PartitionRange, committed_offsets
from transforms.shuffler.release_agent import DECIDED
from transforms.state.dead_letters import ReasonCounts
from transforms.state.files import atomic_write_json, read_json
from transforms.state.ledger import WITHHELD, ReleaseLedger

LOG = logging.getLogger("esa.stream_accounting")
LINEAGE_FILE = "stream_lineage.json"
CARRIED = ("decided", "released", "dead_lettered", "duplicate", "reread")
COUNT_STALL_S = 60.0


@dataclass
class Lineage:
    """Where the lineage's source started (per partition), what its suspended runs accounted for, and the
    savepoint its last run was suspended into (None while a run is live)."""
    start: dict[int, int]
    carried: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CARRIED, 0))
    savepoint: str | None = None
    live: str | None = None  # the run key of the driver running the lineage's job now
    resume: bool = False  # the next run resumes from ``savepoint`` unasked: its driver lost its job server
    stopping: str | None = None  # the Flink job a driver asked to stop into a savepoint, until it is recorded

    def save(self, state: Path) -> None:
        atomic_write_json(state / LINEAGE_FILE, {"start": {str(p): o for p, o in self.start.items()},
                                                 "carried": self.carried, "savepoint": self.savepoint,
                                                 "live": self.live, "resume": self.resume,
                                                 "stopping": self.stopping})


def _load(state: Path) -> Lineage | None:
    found = read_json(state / LINEAGE_FILE)
    if found is None:
        return None
    return Lineage({int(p): int(o) for p, o in found["start"].items()}, dict(found["carried"]), found["savepoint"],
                   found.get("live"), bool(found.get("resume")), found.get("stopping"))


def source_positions(config: JobConfig) -> dict[int, int]:
    """Per partition where a fresh source starts: the group's committed offset, else the beginning."""
    probe = consumer(config.kafka_client, config.bootstrap, config.group_id, **dict(config.kafka_config))
    try:
        partitions = probe.partitions(str(config.reports_topic))
        begin, _ = probe.offsets(str(config.reports_topic), partitions)
        committed = probe.committed(str(config.reports_topic), partitions)
    finally:
        probe.close()
    return {p: begin[p] if committed.get(p) is None else max(int(committed[p]), begin[p]) for p in partitions}


def begin(config: JobConfig, savepoint: str | None, run_key: str) -> Lineage:
    """The lineage this run (``run_key``) continues (resumed from ``savepoint``) or starts (a fresh job)."""
    found = _load(config.state)
    if savepoint is None:
        lineage = Lineage(source_positions(config))
    elif found is None or found.savepoint != savepoint:
        held = "no suspended run" if found is None or found.savepoint is None else f"{found.savepoint}"
        raise JobUsageError(f"--savepoint_path {savepoint}: the state directory {config.state} was suspended into "
                            f"{held}; resume from the savepoint its last run printed (esa shuffle, SIGUSR1)")
    else:
        lineage = found
    lineage.savepoint, lineage.live, lineage.resume, lineage.stopping = None, run_key, False, None
    lineage.save(config.state)
    return lineage


def adopt(config: JobConfig, ledger: ReleaseLedger, savepoint: str) -> None:
    """The job of a dead driver was stopped into ``savepoint``: carry the dead run's durable part of the
    accounting (see the module doc) and let the next ``begin`` resume the lineage from that savepoint."""
    lineage = _load(config.state)
    if lineage is None or lineage.live is None:  # an older esa's lineage: what the dead run did is not known
        LOG.warning("the state directory %s names no live run: the accounting cannot cover the dead driver's run "
                    "and will not balance", config.state)
        lineage = lineage or Lineage(source_positions(config))
    else:
        dead = dead_run(config, ledger, lineage.live)
        LOG.info("the dead driver's run %s accounted for %s", lineage.live, json.dumps(dead))
        lineage.carried = {k: lineage.carried.get(k, 0) + dead.get(k, 0) for k in CARRIED}
    lineage.savepoint, lineage.live, lineage.stopping = savepoint, None, None
    lineage.save(config.state)


def dead_run(config: JobConfig, ledger: ReleaseLedger, run_key: str) -> dict[str, int]:
    """What a killed driver's run accounted for, from what it left durably: its windows' ledger entries and its
    dead-letter counts."""
    decided = released = 0
    for entry in ledger.entries():
        if entry.run_key == run_key:
            released += 0 if entry.status == WITHHELD else entry.n_sets
            decided += int(entry.extra.get(DECIDED, entry.n_sets))
    counts = config.state_layout.dead_letters / "counts"
    letters = sum(ReasonCounts.from_rows(read_json(path)["counts"]).total()
                  for path in counts.glob(f"dead-letter-counts-{run_key}-*.json"))
    return {"decided": decided, "released": released, "dead_lettered": letters}


def records_between(config: JobConfig, start: dict[int, int], end: dict[int, int]) -> int:
    """Records a read_committed consumer reads between ``start`` and ``end`` (per partition)."""
    ranges = [PartitionRange(str(config.reports_topic), p, start[p], stop) for p, stop in sorted(end.items())
              if p in start and stop > start[p]]
    return count_records(config.bootstrap, ranges, timeout_s=COUNT_STALL_S, consumer_config=config.kafka_config,
                         client=config.kafka_client)


def durable(config: JobConfig, lineage: Lineage, totals: Any, counters: dict[str, int]) -> tuple[int, dict[str, int]]:
    """(records consumed, accounting terms) of the whole lineage from durable facts (see the module doc)."""
    end = committed_offsets(config.bootstrap, config.group_id, str(config.reports_topic), config.kafka_config,
                            client=config.kafka_client)
    consumed = records_between(config, lineage.start, {p: o for p, o in end.items() if p in lineage.start})
    now = this_run(totals, counters)
    total = {k: lineage.carried.get(k, 0) + now[k] for k in CARRIED}
    parts = {"dead_lettered": total["dead_lettered"], "reread": total["reread"], "held": 0,
             "deleted": total["decided"] - total["released"], "duplicate": total["duplicate"],
             "released": total["released"]}
    LOG.info("accounting from durable facts: %d records consumed since %s, %s", consumed, lineage.start,
             json.dumps(parts))
    return consumed, parts


def this_run(totals: Any, counters: dict[str, int]) -> dict[str, int]:
    if totals.sets_decided is None:
        raise RuntimeError("a staged release part carries no set count (staged by an older esa): the accounting "
                           "cannot be taken from durable facts")
    return {"decided": totals.sets_decided, "released": totals.sets_released, "dead_lettered": totals.dead_letters,
            "duplicate": counters.get("sets_duplicate", 0), "reread": counters.get("records_reread", 0)}


def suspend(config: JobConfig, lineage: Lineage, totals: Any, counters: dict[str, int], savepoint: str,
            resume: bool = False) -> None:
    """The run was stopped into ``savepoint``: carry what it accounted for to the run that resumes it (asked
    with ``--savepoint_path``; with ``resume``, the next run of the command resumes it unasked)."""
    now = this_run(totals, counters)
    lineage.carried = {k: lineage.carried.get(k, 0) + now[k] for k in CARRIED}
    lineage.savepoint, lineage.live, lineage.resume, lineage.stopping = savepoint, None, resume, None
    lineage.save(config.state)
    if not resume:
        LOG.warning("suspended into %s: resume with --savepoint_path %s", savepoint, savepoint)


def mark_stopping(state: Path, jid: str | None) -> None:
    """Record, before asking Flink to stop job ``jid`` into a savepoint, that it was asked (None: the stop
    failed, the job runs on). A driver killed while it waits leaves the mark, and the next run asks the cluster
    for the savepoint (``pipelines.stream_orphan``) instead of starting afresh without the open windows."""
    lineage = _load(state)
    if lineage is not None and lineage.stopping != jid:
        lineage.stopping = jid
        lineage.save(state)


def stopping(state: Path) -> str | None:
    """The Flink job a driver asked to stop into a savepoint and died before it recorded the savepoint."""
    lineage = _load(state)
    return lineage.stopping if lineage is not None and lineage.savepoint is None else None


def resumable(state: Path) -> str | None:
    """The savepoint the next run resumes from unasked (its driver lost its job server), if any."""
    lineage = _load(state)
    return lineage.savepoint if lineage is not None and lineage.resume else None


@contextlib.contextmanager
def suspend_request() -> Iterator[list[bool]]:
    """SIGUSR1 -> a suspend: the job is stopped into a savepoint, its open windows kept there (main thread only)."""
    asked = [False]
    if threading.current_thread() is not threading.main_thread():
        yield asked
        return

    def _handle(signum: int, frame: Any) -> None:
        asked[0] = True
        LOG.warning("SIGUSR1: suspending the job into a savepoint")

    previous = signal.signal(signal.SIGUSR1, _handle)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGUSR1, previous)


def savepoint_path(options: Any) -> str | None:
    """``--savepoint_path`` (Beam's Flink runner option, passed through to the job server): the job resumes
    from that savepoint, and the driver continues the accounting of the run suspended into it."""
    if options is None:
        return None
    found = options.get_all_options(retain_unknown_options=True).get("savepoint_path")
    return str(found) if found else None
