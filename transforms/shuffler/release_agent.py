"""The streaming shuffler's release agent: the driver-side loop that seals and publishes what the pipeline
staged, one release at a time, while the pipeline keeps running.

Why in the driver and not in the pipeline: the ledger's create-if-absent and its ``flock`` need one POSIX
filesystem (docs/deployment.md), which a cluster's workers do not share; the driver keeps the ledger, the
release files and the keys on its own disk, as the bounded jobs do. The workers write each release's parts,
then a completion marker (``transforms.shuffler.streaming``); the agent acts on a release only once its marker is
there, through the same ``seal_written`` step as the bounded path: write the signed release file (fsync),
seal it (a window sealed before with another digest is refused: at most one release per window, ever),
publish it, mark it published, and only then delete its staged files. A driver killed anywhere in between
finds the release again at its next start: sealed but unpublished releases are republished byte for byte,
staged ones are sealed (to the same digest) or found sealed already.

Dead letters are staged in batches by the workers; the agent moves them into the stage's dead-letter
directory (one Avro file per collection, named by the letters it holds, so a collection redone after a crash
over the same staged files replaces its own file) and publishes them to the shuffler's dead-letter topic
(``<--dead_letter_topic>-shuffle``) if one is set.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apache_beam.io.filesystems import FileSystems

from schemas import encode_record
from transforms.io.kafka.writer import write_records
from transforms.io.sinks import avro_bytes
from transforms.io.staging import (
    StagingError,
    clear_staging,
    is_url,
    iter_staged_entries,
    join,
    load_staged,
    staged_entries,
    staged_files,
)
from transforms.shuffler.release_step import Blankets, ReleaseTarget, StagedParts, seal_written, withheld_entry
from transforms.shuffler.streaming import DEAD_DIR, MARKER, PART, RELEASES, StagedRelease
from transforms.spec import AnalysisSpec
from transforms.state.dead_letters import ReasonCounts, write_counts
from transforms.state.files import atomic_write_bytes
from transforms.state.ledger import ReleaseLedger
from transforms.trust.keys import load_shuffler_signer

LOG = logging.getLogger("esa.release_agent")
DECIDED = "sets_decided"  # the ledger entry's extra: the sets counted into the window's threshold decisions


@dataclass
class AgentTotals:
    """What the agent did so far (for the progress log and the job's summary)."""
    released: int = 0
    withheld: int = 0
    conflicts: int = 0
    dead_letters: int = 0
    dummies: int = 0  # the blanket's dummy reports in the releases published
    # Sets that reached a threshold decision in the windows this agent sealed (released + deleted, withheld
    # windows included): staged by the workers with each part, so it survives a runner restart that resets the
    # runner's counters. None once a part without the count (staged by an older esa) was seen.
    sets_decided: int | None = 0
    sets_released: int = 0  # the real sets in the releases this agent sealed first
    windows: list[tuple[str, str | None, int]] = field(default_factory=list)


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if is_url(path) else str(Path(path).parent)


def _remove(paths: list[str]) -> None:
    if not paths:
        return
    if is_url(paths[0]):
        FileSystems.delete(paths)
        return
    for path in paths:
        Path(path).unlink(missing_ok=True)


class ReleaseAgent:
    """Seals and publishes the releases staged under ``root`` (see the module doc)."""
    def __init__(self, target: ReleaseTarget, specs: Sequence[AnalysisSpec], ledger: ReleaseLedger, root: str,
                 run_key: str):
        self._target, self._ledger, self._root, self._run_key = target, ledger, root, run_key
        self._signer: tuple | None = None
        self._blankets = Blankets(target, specs)
        self.totals = AgentTotals()
        # Letters already collected, by their content-derived names: a runner that restarts from a checkpoint
        # stages again the letters of the bundles it replays, and each must be counted (and published) once.
        self._letters_seen: set[str] = set()

    def step(self) -> int:
        """Handle every release whose marker is staged, then collect staged dead letters; returns the releases
        handled."""
        markers = staged_files(join(self._root, RELEASES), f"*/{MARKER}-*.pkl")
        for marker in markers:
            self._release(_parent(marker))
        self._collect_dead_letters()
        return len(markers)

    def _release(self, directory: str) -> None:
        marker: StagedRelease = load_staged(directory, MARKER)[0]
        # In sub-key order (their staging names); headers only: each part is read when the release is written.
        parts = StagedParts(list(iter_staged_entries(directory, PART)))
        subkeys = [h.subkey for h in parts.headers]
        if tuple(subkeys) != marker.subkeys:
            raise StagingError(f"staged release {directory} has parts {subkeys} but its marker "
                               f"lists {list(marker.subkeys)}: the staging location is damaged")
        key = parts.key
        decided = [h.sets_in for h in parts.headers]
        fresh = self._ledger.get(key) is None  # a window sealed before (a replay) counts once, when first sealed
        if fresh:
            if None in decided or self.totals.sets_decided is None:
                self.totals.sets_decided = None
            else:
                self.totals.sets_decided += sum(decided)  # type: ignore[arg-type]
        # The window's decided sets ride in its ledger entry: a driver killed after sealing it leaves them
        # there for the driver that resumes its job (``pipelines.stream_accounting.adopt``).
        extra = {DECIDED: sum(decided)} if None not in decided else {}  # type: ignore[arg-type]
        if parts.withheld:
            self._ledger.seal_many([replace(withheld_entry(key, marker.source_ends, self._run_key), extra=extra)])
            self.totals.withheld += 1
        else:
            self._signer = self._signer or load_shuffler_signer(self._target.keys)
            written = self._blankets.write(parts, *self._signer)
            del parts
            if seal_written(self._target, self._ledger, written, marker.source_ends, self._run_key,
                            extra):
                self.totals.released += 1
                self.totals.dummies += written.dummies
                self.totals.sets_released += written.n_sets if fresh else 0
                self.totals.windows.append((key.spec_id, key.crowd_id, key.window_end_ms))
                LOG.info("released window ending %d of %s crowd %s (%d sets)", key.window_end_ms, key.spec_id,
                         key.crowd_id, written.n_sets)
            else:
                self.totals.conflicts += 1
        clear_staging(directory)

    def _collect_dead_letters(self) -> None:
        files = staged_files(join(self._root, DEAD_DIR), "dead-*.pkl")
        if not files:
            return
        letters: dict[str, dict[str, Any]] = {}
        for path in files:
            for entry in staged_entries(path):
                if entry.name not in letters and entry.name not in self._letters_seen:
                    letters[entry.name] = entry.load()
        if not letters:
            _remove(files)
            return
        ordered = [letters[name] for name in sorted(letters)]
        digest = hashlib.sha256("\n".join(sorted(letters)).encode()).hexdigest()[:16]
        directory = self._target.state.dead_letters
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(directory / f"dead-letters-stream-{digest}.avro",
                           avro_bytes("DeadLetter", ordered, digest.encode()))
        # named by the run: a driver killed after collecting them leaves the count to the one resuming its job
        write_counts(directory / "counts", f"{self._run_key}-{digest}", ReasonCounts().add_letters(ordered))
        if self._target.dead_letter_stream is not None:
            write_records(self._target.dead_letter_stream,
                          (encode_record("DeadLetter", letter, check=False) for letter in ordered))
        _remove(files)
        self._letters_seen.update(letters)
        self.totals.dead_letters += len(ordered)


def progress(totals: AgentTotals, committed: int, start_committed: int, seconds: float) -> str:
    rate = (committed - start_committed) / seconds if seconds > 0 and committed >= 0 else 0.0
    return (f"{totals.released} release(s), {totals.withheld} withheld, {totals.conflicts} refused, "
            f"{totals.dead_letters} dead letter(s); {max(committed - start_committed, 0):,} records committed "
            f"({rate:,.0f}/s)")
