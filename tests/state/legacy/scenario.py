"""A fixed sequence of analyzer releases on a real ledger, written so that it runs on the esa of any round:
``write.py`` ran it with the esa before typed privacy events (main at 3ec1088) to write ``ledger/`` and
``rows.json``; ``tests/state/test_ledger_events.py`` runs it again with today's esa. Uses only the interfaces
both have: the analyzer's ``write_release`` (in ``pipelines.analyze`` with a ``JobConfig`` then, in
``transforms.analyzer.release_step`` with a typed target now: ``_write`` calls whichever there is),
``estimates.central_epsilon_bound``, ``ReleaseLedger``.

Three populations: OLH (d = 64, eps 2, its blanket pair) under a partition claim (the count charged, one
window withheld); k-RR with two reports per client (composed by its (eps, delta)); RAPPOR (two channels)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipelines.job_config import JobConfig
from schemas import SCHEMA_VERSION
from transforms.analyzer.estimates import central_epsilon_bound
from transforms.analyzer.ledger_rows import Odometers
from transforms.analyzer.releases import OpenedRelease
from transforms.spec import DEFAULT_SPEC, CrowdSpec, load_spec
from transforms.state.ledger import ReleaseLedger

try:  # today: the release step takes the analyzer's typed target
    from pipelines.targets import estimates_target
    from transforms.analyzer.release_step import write_release

    def _write(config: JobConfig, spec: Any, *args: Any) -> None:
        write_release(estimates_target(config), spec, *args)
except ImportError:  # the esa of 3ec1088, which wrote ledger/ and rows.json
    from pipelines.analyze import write_release

    def _write(config: JobConfig, spec: Any, *args: Any) -> None:
        write_release(config, *args)

DAY_MS = 86_400_000
SPLIT = 5  # releases up to this index form the legacy ledger; the rest are released on top of it


def specs() -> list[Any]:
    base = dataclasses.replace(load_spec(DEFAULT_SPEC), window_seconds=86_400)
    olh = dataclasses.replace(base, crowd=dataclasses.replace(CrowdSpec(), partition="app_version"))
    grr = dataclasses.replace(base.with_mechanism("grr", 2.0), max_reports_per_client=2, metric="grr2")
    rappor = dataclasses.replace(base.with_mechanism("rappor", 2.0), metric="rappor")
    return [olh, grr, rappor]


def releases() -> list[tuple[int, int, int, str | None]]:
    """(spec index, day, n, crowd) in release order (OLH's day 2 is withheld: never received)."""
    return [(0, 0, 300, "v1"), (1, 0, 400, None), (0, 1, 1_200, "v1"), (2, 0, 250, None), (0, 3, 5_000, "v1"),
            (1, 1, 1, None), (0, 4, 800, "v1"), (2, 1, 300, None), (1, 2, 900, None)]


def _row(spec: Any, crowd: str | None, end: int, n: int) -> dict[str, Any]:
    eps, bound = central_epsilon_bound(spec.randomizer, n, spec.delta, spec.max_reports_per_client)
    return {"schema_version": SCHEMA_VERSION, "spec_id": spec.spec_id, "analysis": spec.name,
            "window_start": end - DAY_MS, "window_end": end, "crowd_id": crowd, "item": spec.categories[0],
            "item_index": 0, "estimate": 0.1, "stderr": 0.01, "raw_estimate": 0.1, "n_reports": n, "n_clients": n,
            "n_deleted": None, "eps_local": spec.epsilon, "eps_central": eps, "delta": spec.delta,
            "mechanism": spec.mechanism, "parameters": json.dumps({"eps_central_bound": bound})}


def run(root: Path, steps: list[tuple[int, int, int, str | None]]) -> list[dict[str, Any]]:
    """Release ``steps`` with the ledger under ``root / "ledger"``; the published rows, in order."""
    all_specs = specs()
    config = JobConfig(bootstrap="unused:0", specs=tuple(all_specs), out_dir=root / "out")
    ledger, known, odometers = ReleaseLedger(root / "ledger"), {}, Odometers()
    out = []
    for index, day, n, crowd in steps:
        spec = all_specs[index]
        end = (day + 1) * DAY_MS
        release_id = f"r{index}{crowd or ''}{day:05d}"
        opened = OpenedRelease(release_id, spec.spec_id, crowd, end, n, None, {"shuffled/0": day})
        _write(config, spec, ledger, opened, [_row(spec, crowd, end, n)], "run", known, odometers)
        path = config.out_dir / "estimates" / f"spec={spec.name}" / f"window_end_ms={end}"
        out.append(pq.read_table(path / f"part-{release_id}.parquet").to_pylist()[0])
    return out
