"""A release the analyzer cannot analyse is recorded as failed, not sealed, and the stream goes on.

Before, the analyzer sealed a release in its ledger and then computed the population's cumulative epsilon;
when that failed (the grid demo's window epsilon of 16 asked the odometer for a grid it refuses), the run
crashed, and every rerun crashed on the same sealed release: no estimate was ever written again. The failure
is injected here (the real cause is fixed; ``tests/privacy/test_privacy_ledger_unbounded.py``) so that the
job's handling of *any* accounting failure is what is tested.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipelines.demo.population import synthesize
from tests.e2e.chain_harness import (
    SPEC_PATH,
    estimate_parts,
    ledger_entries,
    new_chain,
    produce,
    recent_start,
    run_inline,
    subset,
)
from transforms.analyzer import release_step
from transforms.spec import load_spec

pytestmark = pytest.mark.slow
SPEC = load_spec(SPEC_PATH)
WINDOW_MS = SPEC.window_seconds * 1000


def test_an_unanalysable_release_is_recorded_and_the_next_one_is_analysed(broker, tmp_path, monkeypatch) -> None:
    start = recent_start(WINDOW_MS, back=4)
    population = synthesize(SPEC, 300, windows=2, start_ms=start, seed=5)
    chain = new_chain(broker.bootstrap, tmp_path, "nojam")
    produce(chain, population)
    run_inline(chain, ("encode", "shuffle"))
    first_end = start + WINDOW_MS
    real = release_step.with_cumulative_epsilon

    def failing(spec, rows, population, upto_window_end_ms, *rest):
        if upto_window_end_ms == first_end:
            raise ValueError("interval must be in (0, 0.01], got 0.016")
        return real(spec, rows, population, upto_window_end_ms, *rest)

    monkeypatch.setattr(release_step, "with_cumulative_epsilon", failing)
    summary = run_inline(chain, ("analyze",))["analyze"]
    assert summary.balanced and summary.extra["progress"]["releases_failed"] == 1
    assert [e.key.window_end_ms for e in ledger_entries(chain, "analyze")] == [first_end + WINDOW_MS]
    assert sorted(estimate_parts(chain)) == [first_end + WINDOW_MS]
    failed = [json.loads(p.read_text()) for p in (chain.state("analyze") / "failed_releases").glob("*.json")]
    assert len(failed) == 1 and failed[0]["window_end_ms"] == first_end
    assert "interval must be in" in failed[0]["reason"]
    # The second window's cumulative epsilon composes only what was sealed: the failed window published nothing.
    (sealed,) = ledger_entries(chain, "analyze")
    (alone,) = real(SPEC, [{}], [sealed], sealed.key.window_end_ms)  # the sealed window composed on its own
    assert alone["windows_composed"] == 1
    assert list(summary.extra["progress"]["epsilon"].values()) == [alone["eps_central_cumulative"]]
    monkeypatch.setattr(release_step, "with_cumulative_epsilon", real)
    again = run_inline(chain, ("analyze",))["analyze"]  # no jam: nothing new, nothing re-tried, no crash
    assert again.extra.get("skipped") and len(ledger_entries(chain, "analyze")) == 1
    more = synthesize(SPEC, 200, windows=1, start_ms=start + 2 * WINDOW_MS, seed=6)
    produce(chain, subset(more, np.arange(200)))
    run_inline(chain)
    assert sorted(estimate_parts(chain)) == [first_end + WINDOW_MS, first_end + 2 * WINDOW_MS]
