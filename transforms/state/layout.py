"""One job stage's state directory, its sub-paths named once.

A stage (encode, shuffle, analyze) keeps its state in its own directory, its own trust domain; every
module that reads or writes there goes through these names, so a rename or a new file is one edit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StateDir:
    """Paths inside one stage's state directory (nothing is created or read here)."""

    root: Path

    @property
    def ledger(self) -> Path:
        """The release ledger: one entry per (spec, crowd, window), sealed before it is published."""
        return Path(self.root) / "ledger"

    @property
    def releases(self) -> Path:
        """Sealed release files, kept until published (and republished byte for byte after a crash)."""
        return Path(self.root) / "releases"

    def release_file(self, release_id: str) -> Path:
        return self.releases / f"{release_id}.bin"

    @property
    def failed_releases(self) -> Path:
        """The analyzer's releases it could not use yet, with the reason, retried each run."""
        return Path(self.root) / "failed_releases"

    @property
    def dead_letters(self) -> Path:
        """Dead letters with original bytes: they stay in the domain that read them."""
        return Path(self.root) / "dead_letters"

    @property
    def run_state(self) -> Path:
        """Where the last run ended per partition, its clock and the windows it holds open."""
        return Path(self.root) / "run_state.json"

    @property
    def staging(self) -> Path:
        """The default staging location of a run's intermediate files."""
        return Path(self.root) / "staging"

    @property
    def staging_id(self) -> Path:
        return Path(self.root) / "staging.id"

    @property
    def flink_job_id(self) -> Path:
        """The id in this directory's Flink job names (``pipelines.flink_jobs``): an orphan is found by it."""
        return Path(self.root) / "flink-job.id"
