"""The analyzer's release step, in the driver: validate (odometer) -> seal in the analyst's ledger -> write the
release's estimates (append-only Parquet part) -> publish them to the estimates topic -> mark published.

A release whose privacy accounting fails is never sealed (``UnanalysableRelease``): it is recorded for the operator
(``record_failed_release``) and the stream goes on past it. What it writes to is an ``EstimatesTarget``: the
output directory, the failed-release records, the estimates topic if one is set.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas import encode_record
from transforms.analyzer.ledger_rows import Odometers, event_of, metric_of, with_cumulative_epsilon
from transforms.analyzer.releases import OpenedRelease
from transforms.io.kafka.writer import KafkaTarget, write_records
from transforms.runtime.faults import crash_point
from transforms.spec import AnalysisSpec
from transforms.state.estimate_columns import neighbouring_notion
from transforms.state.estimates_store import write_release_estimates
from transforms.state.files import atomic_write_json
from transforms.state.ledger import ReleaseEntry, ReleaseKey, ReleaseLedger

LOG = logging.getLogger("pipelines.analyze")


@dataclass(frozen=True)
class EstimatesTarget:
    """Exactly what the analyzer's release step writes to: the estimates' output directory (one Parquet part per
    release), the directory of failed-release records, and the estimates topic (None: not published)."""

    out_dir: Path
    failed_releases: Path
    stream: KafkaTarget | None = None


class UnanalysableRelease(Exception):  # noqa: N818 (a verdict on a release, not a program error)
    """A release whose estimates cannot be published (its privacy accounting failed); it was not sealed."""


def record_failed_release(target: EstimatesTarget, opened: OpenedRelease, run_key: str, reason: str) -> Path:
    """Write ``STATE/failed_releases/<release id>.json`` (the operator's record; nothing is published), log it.

    The run goes on and its resume offsets move past the release: it is not retried on its own. An operator
    who fixed the cause replays it by resetting the job (docs/operations.md)."""
    path = target.failed_releases / f"{opened.release_id}.json"
    atomic_write_json(path, {"release_id": opened.release_id, "spec_id": opened.spec_id, "crowd_id": opened.crowd_id,
                             "window_end_ms": opened.window_end_ms, "n_sets": opened.n_sets, "reason": reason,
                             "run_key": run_key, "failed_at_ms": int(time.time() * 1000)})
    LOG.error("release %s (window ending %d of %s, crowd %s) cannot be analysed and was not sealed: %s; "
              "recorded in %s, the stream goes on", opened.release_id, opened.window_end_ms, opened.spec_id,
              opened.crowd_id, reason, path)
    return path


def write_release(target: EstimatesTarget, spec: AnalysisSpec, ledger: ReleaseLedger, opened: OpenedRelease,
                  rows: list[dict[str, Any]], run_key: str,
                  known: dict[str, dict[ReleaseKey, ReleaseEntry]] | None = None, odometers: Odometers | None = None,
                  epsilons: dict[tuple[str, str, str], float | None] | None = None) -> bool:
    """Validate (odometer) -> seal (analyst ledger) -> append-only Parquet part -> topic. True if newly written.

    ``known`` caches each metric's ledger entries (of every spec of that metric: the odometer follows the
    devices, not the spec hash) across the releases of one run (this job holds the state directory's lock,
    so only it adds entries): the ledger is listed once per metric and run, not once per release, which made
    a run of many windows quadratic in the ledger's size. ``odometers`` carries each population's composed
    privacy loss from release to release, so a release costs the same after a year as after a week.
    ``epsilons`` collects each population's (spec name, crowd, notion) cumulative epsilon for the metrics.
    A release whose cumulative epsilon cannot be computed raises UnanalysableRelease before it is sealed."""
    key = ReleaseKey(opened.spec_id, opened.crowd_id, opened.window_end_ms)
    entry = ReleaseEntry(key=key, release_id=opened.release_id, digest=opened.release_id, n_sets=opened.n_sets,
                         n_messages=int(rows[0]["n_reports"]) if rows else 0, batches=0,
                         source_ends=dict(opened.source_ends), run_key=run_key, sealed_at_ms=int(time.time() * 1000),
                         event=event_of(spec, rows))
    known = {} if known is None else known
    if spec.metric not in known:
        known[spec.metric] = {e.key: e for e in ledger.entries() if metric_of(e) == spec.metric}
    # Validate before sealing: a release whose cumulative epsilon cannot be computed must not be sealed as
    # analysed, or every rerun would fail on it again and the stream would jam behind it.
    candidate = {**known[spec.metric], key: known[spec.metric].get(key, entry)}
    population = [e for e in candidate.values() if e.key.crowd_id == opened.crowd_id]
    try:
        rows = with_cumulative_epsilon(spec, rows, population, key.window_end_ms, odometers)
    except Exception as err:
        raise UnanalysableRelease(f"{type(err).__name__}: {err}") from err
    stored, created = ledger.seal(entry)
    if not created and stored.release_id != opened.release_id:
        LOG.error("a second release of window %d of %s was refused", key.window_end_ms, key.spec_id)
        return False
    crash_point("analyze:after_seal")
    known[spec.metric][key] = stored
    if epsilons is not None and rows:
        epsilons[(spec.name, opened.crowd_id or "", neighbouring_notion(rows[0]))] = rows[0]["eps_central_cumulative"]
    for row in rows:
        row["release_id"] = opened.release_id
    _, written = write_release_estimates(target.out_dir, rows, spec_name=spec.name, window_end_ms=key.window_end_ms,
                                         release_id=opened.release_id, kind=spec.kind)
    if target.stream is not None and stored.status != "published":
        write_records(target.stream, ((f"{opened.release_id}:{r['item_index']}".encode(),
                                       encode_record("Estimate", r, check=False)) for r in rows))
    crash_point("analyze:after_publish")
    ledger.mark_published(key)
    return written
