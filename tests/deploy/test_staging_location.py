"""Staging on an object store (``--staging_location s3://...``): the path Dataflow takes, run for real here.

On Dataflow the workers cannot write the driver's disk, so each run's staged results go to a bucket the
driver reads back after the pipeline succeeded. Here the bucket is a loopback S3 server (moto's), the
workers are separate SDK worker processes behind Beam's portable job service (the EXTERNAL environment a
Dataflow VM or a Flink TaskManager uses), and Beam's own S3 filesystem (boto3) does the I/O. Checked
against the in-process chain with local staging on the same raw topic: identical estimates and releases,
no staging object left behind, and a driver killed between the pipeline and the release re-runs to the
identical release.
"""

from __future__ import annotations

import io
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import fastavro
import pytest

from pipelines.demo.population import synthesize
from pipelines.end_to_end import run
from tests.deploy.portable import local_job_service, portable_options, worker_pool
from tests.deploy.s3 import S3Endpoint, s3_store
from tests.deploy.staging_child import start
from tests.e2e.chain_harness import (
    SPEC_PATH,
    Chain,
    JobResult,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    wait_job,
)
from transforms.spec import load_spec
from transforms.state.estimates_store import read_estimates

pytestmark = pytest.mark.slow

N_CLIENTS = 2_000
WINDOWS = 1  # every staged file costs the object store a client and a request or three: keep it small


@pytest.fixture(scope="module")
def world(broker, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The object store, one population on a raw topic, and the in-process chain over it (local staging)."""
    base = tmp_path_factory.mktemp("stagefs")
    spec = load_spec(SPEC_PATH)
    with s3_store() as s3:
        ref = new_chain(broker.bootstrap, base, "ref")
        population = synthesize(spec, N_CLIENTS, windows=WINDOWS, start_ms=recent_start(spec.window_seconds * 1000),
                                seed=11)
        produce(ref, population, bad_per_kind=1)
        reference = run(_chain_config(ref))
        yield {"base": base, "s3": s3, "ref": ref, "reference": reference, "broker": broker}


def _chain_config(chain: Chain, staging_location: str | None = None) -> Any:
    """The chain's config for ``end_to_end.run``, which keeps each stage's state in ``STATE/<stage>``."""
    return replace(chain.config("encode"), state_dir=chain.out / "state", staging_location=staging_location)


def _same_accounting(got: dict, expected: dict) -> None:
    """Equal, except the bad message sets ``produce`` wrote straight to the reference's reports topic."""
    assert got["encode"] == expected["encode"] and got["analyze"] == expected["analyze"]
    bad_sets = expected["shuffle"]["read"] - got["shuffle"]["read"]
    assert bad_sets > 0 and expected["shuffle"]["dead_lettered"] - got["shuffle"]["dead_lettered"] == bad_sets
    assert {k: v for k, v in got["shuffle"].items() if k not in ("read", "dead_lettered")} == \
        {k: v for k, v in expected["shuffle"].items() if k not in ("read", "dead_lettered")}


def _dead_letters(chain: Chain, stage: str) -> list[tuple]:
    files = sorted((chain.out / "state" / stage / "dead_letters").glob("dead-letters-*.avro"))
    letters = [r for p in files for r in fastavro.reader(io.BytesIO(p.read_bytes()))]
    return sorted((r["offset"], r["partition"], r["reason"]) for r in letters)


def _table(out: Path) -> list[dict]:
    return sorted(read_estimates(out).to_pylist(), key=lambda r: (r["window_end"], r["item_index"]))


def test_external_workers_staging_on_s3_match_local_staging(world: Any) -> None:
    s3: S3Endpoint = world["s3"]
    ref: Chain = world["ref"]
    chain = new_chain(world["broker"].bootstrap, world["base"], "portable", raw=ref.raw, keys=ref.keys)
    config = _chain_config(chain, f"s3://{s3.bucket}/portable")
    with local_job_service(world["base"]) as endpoint, worker_pool(world["base"]) as pool:
        started = time.perf_counter()
        summary = run(config, portable_options(endpoint, "EXTERNAL", pool, extra=s3.flags()))
        print(f"PortableRunner EXTERNAL, staging on s3: {time.perf_counter() - started:.1f} s")
    assert summary.balanced
    _same_accounting(summary.accounting, world["reference"].accounting)
    letters = _dead_letters(chain, "encode")
    assert letters and letters == _dead_letters(ref, "encode")  # staged on s3 as Avro shards
    rows = _table(chain.out)
    assert len(rows) == WINDOWS * load_spec(SPEC_PATH).d
    assert rows == _table(ref.out)  # every column: estimates, stderr, release ids, the odometer
    for stage in ("encode", "shuffle", "analyze"):
        assert (chain.out / "state" / stage / "staging.id").is_file()  # it staged under the URL ...
        assert not (chain.out / "state" / stage / "staging").exists()  # ... and never on the driver's disk
    assert s3.keys("portable/") == []  # and left nothing behind
    assert [(e.key, e.digest) for e in ledger_entries(chain, "shuffle")] == \
        [(e.key, e.digest) for e in ledger_entries(ref, "shuffle")]


def _job(chain: Chain, stage: str, staging: str, s3: S3Endpoint, crash_at: str | None = None) -> JobResult:
    result = wait_job(start(stage, chain.as_json(), staging, s3.flags(), crash_at))
    if crash_at:
        assert result.killed, (crash_at, result.returncode, result.stderr[-2000:])
    else:
        assert result.returncode == 0 and result.summary, result.stderr[-3000:]
    return result


def test_driver_killed_after_the_pipeline_reruns_to_the_identical_release(world: Any) -> None:
    s3: S3Endpoint = world["s3"]
    ref: Chain = world["ref"]
    # the shuffler reads the reference's reports topic (its own group and state): the same input log
    chain = replace(new_chain(world["broker"].bootstrap, world["base"], "crash", raw=ref.raw, keys=ref.keys),
                    reports=ref.reports)
    staging = f"s3://{s3.bucket}/crash"
    _job(chain, "shuffle", staging, s3, "shuffle:after_pipeline")
    assert any(k.rsplit("/", 1)[1].startswith("part-") for k in s3.keys("crash/"))  # staged, never sealed
    assert ledger_entries(chain, "shuffle") == []
    shuffled = _job(chain, "shuffle", staging, s3)
    _job(chain, "analyze", staging, s3, "analyze:after_pipeline")
    assert s3.keys("crash/") and not (chain.out / "estimates").exists()
    analyzed = _job(chain, "analyze", staging, s3)
    assert shuffled.summary["balanced"] and analyzed.summary["balanced"]
    assert shuffled.summary["parts"] == world["reference"].stages["shuffle"].parts
    assert s3.keys("crash/") == []
    entries, expected = ledger_entries(chain, "shuffle"), ledger_entries(ref, "shuffle")
    assert len(entries) == WINDOWS and all(e.published for e in entries)
    assert [(e.key, e.digest) for e in entries] == [(e.key, e.digest) for e in expected]  # byte-identical
    assert _table(chain.out) == _table(ref.out)
