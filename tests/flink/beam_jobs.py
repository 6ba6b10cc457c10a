"""Helpers of the Beam-on-Flink tests: one population on fresh topics, the esa commands of the Beam 2.62.0
environment run as subprocesses (this test process runs the newest Beam), and what two runs are compared on:
the estimate rows, the release ledgers of the shuffler and the analyzer, and the record accounting."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pipelines.demo.population import synthesize
from pipelines.demo.simulate import produce_population
from pipelines.enrolment import enrol_simulated
from pipelines.flink_cluster import LocalFlinkCluster
from transforms.spec import load_spec
from transforms.state.estimates_store import read_estimates
from transforms.state.ledger import ReleaseLedger

SEED = 17
SPEC_TOML = """\
[analysis]
name = "flink_olh"
metric = "flink_olh"

[domain]
size = 16

[mechanism]
name = "olh"
epsilon = 3.0

[window]
size_seconds = 3600

[crowd]
epsilon = 1.0
delta = 1e-6

[privacy]
delta = 1e-6
"""
# Every column a consumer reads; all must be bit-identical across runners.
COLUMNS = ("spec_id", "window_start", "window_end", "crowd_id", "item", "item_index", "estimate", "stderr",
           "raw_estimate", "n_reports", "n_clients", "eps_local", "eps_central", "delta", "mechanism")
RUN_TIMEOUT_S = 2400  # a chain of three jobs on a loaded 2-core machine


@dataclass
class Topics:
    """One population produced to ``stem-raw``; each run reads it through its own group and topics."""

    base: Path
    bootstrap: str
    stem: str
    spec_path: Path

    def flags(self, name: str) -> list[str]:
        return [f"--spec={self.spec_path}", f"--kafka_bootstrap={self.bootstrap}", f"--raw_topic={self.stem}-raw",
                f"--reports_topic={self.stem}-{name}-rep", f"--shuffled_topic={self.stem}-{name}-shuf",
                f"--consumer_group={self.stem}-{name}", f"--output_dir={self.base / name}",
                f"--state_dir={self.base / name / 'state'}", f"--keys_dir={self.base / 'keys'}",
                f"--seed={SEED}", "--drain", "--create_topics"]


def produce(bootstrap: str, base: Path, n_clients: int) -> Topics:
    spec_path = base / "flink_olh.toml"
    spec_path.write_text(SPEC_TOML)
    spec = load_spec(spec_path)
    stem = f"flink-{int(time.time() * 1000)}"
    window_ms = spec.window_seconds * 1000
    start_ms = (int(time.time() * 1000) // window_ms - 4) * window_ms  # recent, closed windows
    population = synthesize(spec, n_clients, windows=2, start_ms=start_ms, seed=SEED)
    enrol_simulated(base / "keys", population.client_ids.tolist())
    produce_population(bootstrap, spec, population, bad_per_kind=1, seed=SEED, raw_topic=f"{stem}-raw",
                       reports_topic=f"{stem}-bad")
    return Topics(base, bootstrap, stem, spec_path)


def esa(env: Path, command: str, *args: str) -> dict:
    """``<env>/bin/esa COMMAND ARGS``: its JSON summary line (AssertionError with its stderr if it failed)."""
    child = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    done = subprocess.run([str(env / "bin" / "esa"), command, *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=child)
    assert done.returncode == 0, f"esa {command} exited {done.returncode}: {done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def rows(out_dir: Path) -> list[tuple]:
    table = read_estimates(out_dir).to_pydict()
    return sorted(zip(*(table[c] for c in COLUMNS), strict=True), key=lambda r: (r[1], r[5]))


def ledgers(state: Path) -> dict[str, list[tuple]]:
    """The shuffler's and the analyzer's release ledgers: what was released, with which content digest."""
    return {stage: sorted((str(e.key), e.release_id, e.digest, e.n_sets, e.n_messages, e.batches, e.status)
                          for e in ReleaseLedger(state / stage / "ledger").entries())
            for stage in ("shuffle", "analyze")}


def job_states(cluster: LocalFlinkCluster) -> dict[str, str]:
    return {j["jid"]: j["state"] for j in cluster.get("/jobs/overview")["jobs"]}
