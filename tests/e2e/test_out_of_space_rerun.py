"""A job whose writes are refused for lack of space stops with one line and exit 7, loses nothing, and the
rerun releases exactly what an uninterrupted chain releases.

The refusal is the kernel's: the shuffle job runs as ``esa shuffle`` in a subprocess under a file-size limit
(RLIMIT_FSIZE), so its writes past the limit fail with EFBIG exactly where a full disk fails them with ENOSPC
(both are an OSError from ``write``, inside a Beam worker or in the driver); that needs no privilege, unlike
mounting a small filesystem. A reference chain reads the same raw topic with the same keys, uninterrupted.
"""

from __future__ import annotations

import pytest

from pipelines.demo.population import synthesize
from pipelines.exit_codes import ExitCode
from tests.e2e.chain_harness import (
    SPEC_PATH,
    estimate_rows,
    files_under,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    run_inline,
    start_cli,
)
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
LIMIT_BYTES = 32 * 1024  # below the job's spill files and staged parts at this size, above its small state files


def _run_cli(chain, command: str, file_size_limit: int | None = None) -> tuple[int, str]:
    proc = start_cli(chain, command, file_size_limit=file_size_limit)
    _out, err = proc.communicate(timeout=240)
    return proc.returncode, err


def test_refused_writes_stop_the_job_cleanly_and_the_rerun_releases_the_same(broker, tmp_path) -> None:
    spec = load_spec(SPEC_PATH)
    ref = new_chain(broker.bootstrap, tmp_path, "ref")
    full = new_chain(broker.bootstrap, tmp_path, "full", raw=ref.raw)
    produce(ref, synthesize(spec, 1500, windows=1, start_ms=recent_start(spec.window_seconds * 1000), seed=23))
    run_inline(ref)
    run_inline(full, ("encode",))

    code, err = _run_cli(full, "shuffle", file_size_limit=LIMIT_BYTES)
    last = err.strip().splitlines()[-1]
    assert code == ExitCode.OUT_OF_SPACE, err[-3000:]
    # the file-size limit (EFBIG) as the OS says it, or as the device store, whose SQLite hides the errno, does
    assert last.startswith(("esa shuffle: error: out of space: [Errno 27] File too large",
                            "esa shuffle: error: out of space: [Errno 28] the device store could not be written")), last
    assert "Nothing is lost" in last and "start the job again" in last
    assert ledger_entries(full, "shuffle") == []  # nothing sealed, so nothing can have been published
    assert not (full.state("shuffle") / "run_state.json").exists()  # nothing consumed as far as the state says
    litter = [p for p in full.state("shuffle").rglob("*") if p.name.endswith(".partial")]
    assert litter == []  # a refused spill file does not keep the space it got

    code, err = _run_cli(full, "shuffle")
    assert code == 0, err[-3000:]
    assert [e.key for e in ledger_entries(full, "shuffle")] == [e.key for e in ledger_entries(ref, "shuffle")]
    releases = files_under(full.state("shuffle") / "releases")
    assert releases and releases == files_under(ref.state("shuffle") / "releases")  # byte for byte
    assert not any(full.state("shuffle").glob("staging/*/*"))  # the rerun cleared the failed attempt's files

    run_inline(full, ("analyze",))
    assert estimate_rows(full) == estimate_rows(ref)
