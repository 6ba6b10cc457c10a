"""A window the crowd threshold withholds is closed for good: sealed in the ledger as withheld (nothing is
published), so later reports for it are late instead of forming a second, new crowd for the same window."""

from __future__ import annotations

import pickle
from pathlib import Path

from pipelines.enrolment import enrol_simulated
from pipelines.job import BoundedRun
from pipelines.job_config import JobConfig
from pipelines.shuffle import seal_run
from transforms.io.kafka.bounded import PartitionRange
from transforms.io.staging import stable_name, write_batch
from transforms.shuffler.graph import ReleasePart
from transforms.spec import load_spec
from transforms.state.ledger import WITHHELD, ReleaseKey, ReleaseLedger
from transforms.state.prior_runs import PriorRuns, released_lookup
from transforms.state.run_state import RunState

SPEC = load_spec(Path(__file__).resolve().parents[2] / "examples" / "app_language.toml")
END = 1_800_000_000_000 // 3_600_000 * 3_600_000


def test_a_withheld_window_is_sealed_unpublished_and_makes_later_reports_late(tmp_path: Path) -> None:
    config = JobConfig(bootstrap="127.0.0.1:1", specs=(SPEC,), out_dir=tmp_path / "out", state_dir=tmp_path / "state",
                       keys_dir=tmp_path / "keys", shuffled_topic="never-written")
    enrol_simulated(config.keys, ["c0"])
    staging = tmp_path / "staging"
    staging.mkdir()
    parts = [ReleasePart(SPEC.spec_id, None, END, subkey, (), 0, None) for subkey in (0, 3)]  # all empty
    write_batch(staging, "part", [(stable_name(p.subkey), pickle.dumps(p)) for p in parts])
    run = BoundedRun(config, "shuffle", "reports", RunState(), [PartitionRange("reports", 0, 0, 40)], "k1", staging,
                     END + 10)
    ledger = ReleaseLedger(config.state / "ledger")
    released, conflicts = seal_run(run, ledger)  # publishing would fail: no broker at 127.0.0.1:1
    assert (released, conflicts) == (0, 0)
    entry = ledger.get(ReleaseKey(SPEC.spec_id, None, END))
    assert entry is not None and entry.status == WITHHELD and entry.batches == 0
    assert ledger.unpublished() == []  # nothing to republish after a crash
    prior = PriorRuns(processed_until={"reports/0": 40}, released=released_lookup(ledger.entries(SPEC.spec_id)))
    assert prior.replayed((SPEC.spec_id, None, END), "reports/0", 55)  # a later report: late, not a new crowd
